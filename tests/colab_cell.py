# Colab set-up: in Google Colab, install the version of mhbook this book was written with
# (with its `hf` extra: Part V needs transformers 5, which Colab may not have yet).
# Locally and in CI this cell installs nothing (mhbook is installed with `pip install -e .`).
# It then prints the machine: float results differ in their last digits between machines.
import os
import subprocess
import sys

MHBOOK_VERSION = "0.3.0"
MHBOOK_SOURCE = os.environ.get(
    "MHBOOK_SOURCE", f"mhbook[hf] @ git+https://github.com/mhbook/mhbook@v{MHBOOK_VERSION}"
)
if "google.colab" in sys.modules or "MHBOOK_SOURCE" in os.environ:
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", MHBOOK_SOURCE], check=True)

import mhbook

print(mhbook.describe_machine())
