"""The browser tests' tab (``tests/browser.py``'s ``Visit``): leaving a page waits for its
requests, so a request the test's own navigation would cut short (Chromium asks for the page's
icon after ``load``) is not reported as the book's failure, and a request that never finishes is.

A page on a local server asks, just after ``load``, for a file the server answers only when the
test says so (``serve`` of book_server.py answers every file at once). Chromium is
tests/conftest.py's: without it the test is skipped, unless ``CI`` is set.
"""

from __future__ import annotations

import functools
import http.server
import threading

import pytest
from browser import Visit

PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>t</title></head>
<body><main><h1>t</h1><img id="late" alt="late"></main><script>
addEventListener("load", () => setTimeout(() => {
  document.getElementById("late").src = "slow.svg";
}, 20));
</script></body></html>"""
SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>'


@pytest.fixture
def site(tmp_path):
    """A server of two pages whose ``slow.svg`` is answered once ``release`` is set."""
    (tmp_path / "a.html").write_text(PAGE, encoding="utf-8")
    (tmp_path / "b.html").write_text(PAGE.replace("slow.svg", "b.svg"), encoding="utf-8")
    (tmp_path / "b.svg").write_text(SVG, encoding="utf-8")
    release = threading.Event()

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            if self.path.endswith("/slow.svg"):
                release.wait(10)
                body = SVG.encode()
                self.send_response(200)
                self.send_header("Content-Type", "image/svg+xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            super().do_GET()

        def log_message(self, *args):
            pass

    handler = functools.partial(Handler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", release
    release.set()
    server.shutdown()


def test_leaving_waits_for_the_pages_requests(chromium, site):
    url, release = site
    visit = Visit(chromium, url)
    try:
        with visit.page.expect_request("**/slow.svg"):
            visit.open("a.html")
        threading.Timer(0.5, release.set).start()  # slow.svg comes after half a second
        visit.open("b.html")  # waits for it, then leaves
        visit.settle()
        assert not visit.failed and not visit.js_errors, (visit.failed, visit.js_errors)
    finally:
        visit.close()


def test_a_request_that_never_finishes_is_a_failure(chromium, site):
    url, _ = site
    visit = Visit(chromium, url)
    try:
        visit.open("a.html")
        visit.settle(limit_s=1)
        assert visit.failed == ["a.html: still loading after 1 s: " + url + "slow.svg"]
    finally:
        visit.close()
