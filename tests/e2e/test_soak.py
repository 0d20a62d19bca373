"""A bounded soak on loopback: 64 clients for about 40 s, a quarter of the streams cut off
mid-way, malformed requests among them, flushes and rebuilds under the admin key, then one
SIGTERM. No 5xx, every stream read to its end got [DONE], `/metrics` accounts for every
request the engine took, and the server exits 0."""

from __future__ import annotations

import json
import random
import signal
import threading
import time

import requests

from conftest import start_server
from helpers import get

CLIENTS = 64
SECONDS = 40.0
ADMIN = "soak-admin"

MALFORMED = [
    (b"{not json", "application/json"),
    (json.dumps({"prompt": "hi", "max_tokens": -3}).encode(), "application/json"),
    (json.dumps({"prompt": 42, "max_tokens": 4}).encode(), "application/json"),
    (json.dumps({"prompt": "hi", "temperature": "hot"}).encode(), "application/json"),
    (json.dumps({"prompt": "hi", "max_tokens": 4}).encode(), "text/plain"),
    (json.dumps({"prompt": "hi", "max_tokens": 4, "n": 17}).encode(), "application/json"),
    (json.dumps({"messages": [], "max_tokens": 4}).encode(), "application/json"),
]


def finished_total(base: str) -> dict[str, float]:
    text = requests.get(base + "/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith("strata_requests_finished_total{"):
            reason = line.split('reason="')[1].split('"')[0]
            out[reason] = float(line.split()[-1])
    return out


def test_soak(log_dir):
    s = start_server(log_dir, "--shutdown-timeout", "10", "--max-waiting-requests", "4096",
                     name="soak", admin_key=ADMIN)
    lock = threading.Lock()
    stats = {"accepted": 0, "done": 0, "cut": 0, "malformed": 0, "admin": 0}
    failures: list[str] = []
    deadline = time.monotonic() + SECONDS
    pages = get(s, "/v1/cache/status").json()["num_pages"]

    def note(key: str):
        with lock:
            stats[key] += 1

    def fail(msg: str):
        with lock:
            failures.append(msg)

    def client(seed: int):
        rng = random.Random(seed)
        session = requests.Session()
        while time.monotonic() < deadline:
            roll = rng.random()
            try:
                if roll < 0.15:
                    body, ctype = rng.choice(MALFORMED)
                    r = session.post(s.base + "/v1/completions", data=body,
                                     headers={"Content-Type": ctype}, timeout=60)
                    if r.status_code >= 500 or r.status_code < 400:
                        fail(f"malformed request answered {r.status_code}: {r.text[:200]}")
                    note("malformed")
                elif roll < 0.18:
                    path = "/v1/cache/flush" if rng.random() < 0.7 else "/v1/cache/rebuild"
                    body = {"num_pages": pages} if path.endswith("rebuild") else None
                    r = session.post(s.base + path, json=body, timeout=120,
                                     headers={"Authorization": f"Bearer {ADMIN}"})
                    if r.status_code != 200:
                        fail(f"{path} answered {r.status_code}: {r.text[:200]}")
                    note("admin")
                else:
                    cut = rng.random() < 0.25
                    body = {"prompt": f"Story {seed}-{rng.randrange(1000)}: once upon a time",
                            "max_tokens": rng.randint(4, 20), "temperature": rng.choice([0, 0.8]),
                            "seed": rng.randrange(1 << 30), "stream": True}
                    with session.post(s.base + "/v1/completions", json=body, stream=True,
                                      timeout=120) as r:
                        if r.status_code != 200:
                            if r.status_code >= 500:
                                fail(f"completion answered {r.status_code}: {r.text[:200]}")
                            continue
                        note("accepted")
                        done = False
                        for raw in r.iter_lines():
                            if cut:
                                break  # hang up after the first line
                            if raw == b"data: [DONE]":
                                done = True
                        if cut:
                            note("cut")
                            session.close()
                            session = requests.Session()
                        elif done:
                            note("done")
                        else:
                            fail("a stream ended without [DONE]")
            except requests.RequestException as e:
                fail(f"client error: {e!r}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(SECONDS + 180)
        # Let the engine see every hang-up, then account for every request it took.
        settle = time.monotonic() + 60
        while time.monotonic() < settle:
            st = get(s, "/v1/cache/status").json()
            if st["running_requests"] == 0 and st["waiting_requests"] == 0:
                break
            time.sleep(0.2)
        fin = finished_total(s.base)
        s.proc.send_signal(signal.SIGTERM)
        code = s.proc.wait(60)
    finally:
        s.stop()
    print(stats, fin)
    assert not failures, f"{len(failures)} failures, first: {failures[:5]}"
    assert stats["accepted"] > CLIENTS and stats["cut"] > 0 and stats["malformed"] > 0 and stats["admin"] > 0, stats
    assert fin.get("error", 0) == 0, fin
    assert sum(fin.values()) == stats["accepted"], (fin, stats)
    assert fin.get("cancelled", 0) <= stats["cut"], (fin, stats)
    assert stats["done"] + stats["cut"] == stats["accepted"], stats
    assert code == 0, s.log_tail()
