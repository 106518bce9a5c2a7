"""`python -m bench.thread_memory`: what a lane worker's thread keeps in memory after each kind of work a send does.

M (bench B2) is the peak RSS of a bulk lane worker, and a bulk lane runs 384 threads: what each thread keeps once it
has worked is paid 384 times. Here THREADS threads (384) of one process each do one kind of work, then park; the
main thread reads the process's RSS; then every thread does the next kind. Each kind is what a send does: a statement
through the kept prepared cursor, giving the connection back to the pool (as before a call to Evolution); a Redis
command through the process's client; a POST through the thread's HTTP session to a local server that answers like
sendText. The last step does all three again: what a second send adds. Needs `make services` and a migrated database.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

os.environ.setdefault("DATABASE_POOL_MAX_SIZE", "8")  # as a threads-pool lane worker (pilot_status.lane_worker)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pilot_status.settings")

PORT = 18777
SERVER = f"""
import http.server, json, time
class Answer(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        time.sleep(0.05)
        body = json.dumps({{"key": {{"id": "X" * 20, "remoteJid": "5511@s.whatsapp.net", "fromMe": True}},
                           "status": "PENDING", "message": {{"conversation": "hi " * 100}}}}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer.daemon_threads = True
http.server.ThreadingHTTPServer.request_queue_size = 1024
http.server.ThreadingHTTPServer(("127.0.0.1", {PORT}), Answer).serve_forever()
"""


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS")).split()[1]) / 1024


def main() -> None:
    import django

    django.setup()
    from messaging.prepared import prepared_cursor
    from messaging.sending import gateway
    from pilot_status import metrics
    from pilot_status.database import release_while_waiting

    def statement() -> None:
        with prepared_cursor() as cursor:
            cursor.execute("SELECT id, text, variables, metadata FROM messaging_message ORDER BY created_at DESC LIMIT 1")
            cursor.fetchall()
        release_while_waiting()

    def redis_command() -> None:
        metrics.redis().get("ps:bench:thread-memory")

    def post() -> None:
        gateway._session().post(f"http://127.0.0.1:{PORT}/message/sendText/probe", json={"number": "5511", "text": "hi" * 50},
                                timeout=30).json()

    def again() -> None:
        statement(), redis_command(), post()

    steps: list[tuple[str, Callable[[], None]]] = [
        ("thread", lambda: None), ("statement", statement), ("redis", redis_command), ("post", post), ("again", again)]
    threads = int(os.environ.get("THREADS", "384"))
    server = subprocess.Popen([sys.executable, "-c", SERVER])
    time.sleep(1)
    barrier = threading.Barrier(threads + 1)
    errors: list[str] = []

    def work() -> None:
        for _, step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 (counted and shown)
                errors.append(repr(exc))
            barrier.wait()  # done: the main thread reads RSS
            barrier.wait()  # go on

    try:
        rss = {"before": rss_mb()}
        for _ in range(threads):
            threading.Thread(target=work, daemon=True).start()
        for name, _ in steps:
            barrier.wait()
            gc.collect()
            time.sleep(0.2)
            rss[name] = rss_mb()
            barrier.wait()
    finally:
        server.kill()
    names = list(rss)
    per_thread = {name: round((rss[name] - rss[names[i]]) * 1024 / threads, 1) for i, name in enumerate(names[1:])}
    print(json.dumps({"threads": threads, "rss_mb": {k: round(v, 1) for k, v in rss.items()},
                      "kb_per_thread": per_thread, "errors": len(errors), "first_errors": errors[:3]}))


if __name__ == "__main__":
    main()
