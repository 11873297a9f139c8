"""Edge benchmarks through a real Mosquitto with mutual TLS (loopback only, bounded in count and time).

1. signed messages/s end to end: a device client seals (ECDSA P-256) and publishes QoS 1, a subscriber
   verifies every signature; the same without signing is the baseline (ratio printed).
2. drain time of an offline backlog: the agent's SQLite outbox holds N results (default 100,000) when
   ``edge-agent run`` starts; time until the gateway stored and acknowledged them all (target <= 60 s).
3. agent resident memory (VmRSS of the ``edge-agent run`` process) while draining (peak) and idle.
4. ``--soak``: N agents (default 50) as processes, their outboxes holding M results in all (default
   100,000), each also running a live task of R results, while Mosquitto and agents are SIGKILLed and
   restarted at random; then every device's results are checked: none lost, none stored twice, every
   task reported once.

Usage: python bench/edge.py [--messages 20000] [--backlog 100000]
       python bench/edge.py --soak [--agents 50] [--backlog 100000] [--task-results 200] [--seconds 900]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import paho.mqtt.client as mqtt  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion  # noqa: E402

from broker import devices  # noqa: E402
from broker.clock import utcnow  # noqa: E402
from broker.gateway import Gateway  # noqa: E402
from broker.migrations import upgrade  # noqa: E402
from broker.store import Store  # noqa: E402
from edge import pki, protocol  # noqa: E402
from edge.agent.config import AgentConfig  # noqa: E402
from edge.agent.store import Store as AgentStore  # noqa: E402
from edge.mqttconf import MosquittoConfig, write_config  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def client(cid: str, ca: Path, cert: Path, key: Path, port: int, v5: bool = True) -> mqtt.Client:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid,
                    protocol=MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311)
    c.tls_set(ca_certs=str(ca), certfile=str(cert), keyfile=str(key), tls_version=ssl.PROTOCOL_TLS_CLIENT)
    c.max_inflight_messages_set(100)
    c.max_queued_messages_set(0)
    ready = threading.Event()
    c.on_connect = lambda *_a: ready.set()
    c.connect("127.0.0.1", port)
    c.loop_start()
    if not ready.wait(10):
        raise SystemExit(f"{cid} could not connect")
    return c


def e2e_rate(n: int, signed: bool, ca: pki.CertificateAuthority, dev: tuple[Path, Path], port: int) -> float:
    d = ca.directory
    key = pki.load_key(dev[1])
    pub = key.public_key()
    got = threading.Semaphore(0)
    bad = []
    sub = client(f"bench-sub-{signed}", d / "ca.pem", d / "gateway.pem", d / "gateway.key", port)

    def on_message(_c: mqtt.Client, _u: object, m: mqtt.MQTTMessage) -> None:
        if signed:
            try:
                protocol.verify_signature(protocol.open_envelope(m.payload), pub)
            except protocol.Rejected:
                bad.append(1)
        got.release()

    sub.on_message = on_message
    sub.subscribe("hb/v1/dev/bench-dev/up/#", qos=1)
    time.sleep(0.3)
    pubc = client("bench-dev", d / "ca.pem", dev[0], dev[1], port)
    body = {"value": "x" * 900}
    t0 = time.perf_counter()
    for i in range(n):
        payload = (protocol.seal("result", body, device="bench-dev", seq=i, key=key) if signed
                   else protocol.canonical({"v": 1, "seq": i, "body": body}))
        pubc.publish(protocol.up_topic("bench-dev", "result"), payload, qos=1)
    for _ in range(n):
        if not got.acquire(timeout=60):
            raise SystemExit("messages lost in the e2e benchmark")
    dt = time.perf_counter() - t0
    for c in (pubc, sub):
        c.disconnect()
        c.loop_stop()
    assert not bad
    return n / dt


def enroll_device(store: Store, ca: pki.CertificateAuthority, device_id: str, state: Path) -> tuple[Path, Path]:
    """Enroll ``device_id`` into ``store`` and write its key, certificate, CA and gateway certificate into
    ``state`` (what ``edge-agent enroll`` leaves there); returns the certificate and key paths."""
    key = pki.generate_key()
    state.mkdir(parents=True, exist_ok=True)
    pki.write_private(state / "device.key", pki.key_to_pem(key))
    with store.tx() as s:
        tok = devices.create_enroll_token(s, "bench", now=utcnow())
    with store.tx() as s:
        _d, pem = devices.enroll_device(s, ca, tok, pki.make_csr(key, device_id).decode(), now=utcnow())
    (state / "device.pem").write_text(pem)
    shutil.copyfile(ca.directory / "ca.pem", state / "ca.pem")
    shutil.copyfile(ca.directory / "gateway.pem", state / "gateway.pem")
    return state / "device.pem", state / "device.key"


TASK = (
    "import sys, time\n"
    "for i in range(int(sys.argv[1])):\n"
    "    print('@hb-result %d' % i, flush=True)\n"
    "    time.sleep(0.02)\n"
)


def soak(tmp: Path, *, agents: int, backlog: int, task_results: int, seconds: float, seed: int) -> bool:
    """The soak of the module docstring (4.); prints its figures and returns whether nothing was lost or
    duplicated."""
    from broker.gateway import RecordingSink

    rng = random.Random(seed)
    mosq_bin = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    ca = pki.CertificateAuthority.init(tmp / "ca")
    port = free_port()
    conf = write_config(tmp / "mqtt", ca_file=ca.directory / "ca.pem", cert_file=ca.directory / "server.pem",
                        key_file=ca.directory / "server.key", crl_file=ca.directory / "crl.pem",
                        config=MosquittoConfig(port=port, bind_address="127.0.0.1",
                                               user="root" if os.geteuid() == 0 else None))

    def start_mosquitto() -> subprocess.Popen[bytes]:
        p = subprocess.Popen([mosq_bin, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _MOSQ.append(p)
        time.sleep(0.3)
        return p

    mosq = start_mosquitto()
    store = Store(f"sqlite:///{tmp / 'broker.db'}")
    upgrade(store.engine)
    per = backlog // agents
    ids = [f"soak-{i:03d}" for i in range(agents)]
    for i, dev_id in enumerate(ids):
        state = tmp / dev_id
        enroll_device(store, ca, dev_id, state)
        AgentConfig(state_dir=str(state), device_id=dev_id, mqtt_port=port, heartbeat_seconds=10,
                    capacity_seconds=3600, retransmit_seconds=5, reconnect_max_seconds=2, window=500,
                    task_user="", max_parallel_tasks=1).save()
        ast = AgentStore(state / "agent.db")
        ast.put_many([("result", {"task_id": f"backlog-{i}", "n": n, "value": n}, f"backlog-{i}/r{n}", False)
                      for n in range(per)])
        ast.close()
    sink = RecordingSink()
    gw = Gateway(store, host="127.0.0.1", port=port, ca_file=str(ca.directory / "ca.pem"),
                 cert_file=str(ca.directory / "gateway.pem"), key_file=str(ca.directory / "gateway.key"), sink=sink)
    gw.start()
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def start_agent(dev_id: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "edge.agent.cli", "--state-dir", str(tmp / dev_id), "run"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        return _soak_run(tmp, store, gw, sink, ids, procs, start_agent, start_mosquitto, mosq, rng, per=per,
                         agents=agents, task_results=task_results, seconds=seconds)
    finally:
        gw.stop()
        for p in procs.values():
            p.kill()
            p.wait()
        for m in _MOSQ:
            if m.poll() is None:
                m.kill()
                m.wait()
        store.dispose()


_MOSQ: list[subprocess.Popen[bytes]] = []


def _soak_run(tmp: Path, store: Store, gw: Gateway, sink: Any, ids: list[str], procs: dict[str, Any], start_agent: Any,
              start_mosquitto: Any, mosq: Any, rng: random.Random, *, per: int, agents: int, task_results: int,
              seconds: float) -> bool:
    from datetime import timedelta

    from broker.model import JobSpec, Request

    procs.update({d: start_agent(d) for d in ids})
    spec = JobSpec(name="soak", request=Request(name="soak", vcpus=1, memory_gib=0.25, duration_hours=0.1),
                   command=(sys.executable, "-c", TASK, str(task_results)))
    for i, dev_id in enumerate(ids):
        gw.dispatch(dev_id, f"job-{i}", spec, utcnow() + timedelta(hours=1))
    want = agents * (per + task_results)
    count_q = sa.text("SELECT COUNT(*) FROM edge_uplinks WHERE kind='result' AND msg_id NOT LIKE :final"
                      ).bindparams(final="%/final")

    def stored() -> int:
        with store.engine.connect() as conn:
            return int(conn.execute(count_q).scalar_one())

    t0 = time.perf_counter()
    kills = {"mosquitto": 0, "agent": 0}
    next_kill = t0 + rng.uniform(2, 6)
    n = 0
    while time.perf_counter() - t0 < seconds:
        time.sleep(0.5)
        done = sum(1 for i in range(agents) if any(c[0] == f"job-{i}" and c[1] == "SUCCEEDED" for c in sink.calls))
        n = stored()
        if n >= want and done == agents:
            break
        if time.perf_counter() >= next_kill and n < want * 0.9 and time.perf_counter() - t0 < seconds * 0.8:
            if rng.random() < 0.3:
                mosq.kill()
                mosq.wait()
                time.sleep(rng.uniform(0.5, 2.0))
                mosq = start_mosquitto()
                kills["mosquitto"] += 1
            else:
                for dev_id in rng.sample(ids, k=max(1, agents // 25)):
                    procs[dev_id].kill()
                    procs[dev_id].wait()
                    procs[dev_id] = start_agent(dev_id)
                    kills["agent"] += 1
            next_kill = time.perf_counter() + rng.uniform(8, 16)
    elapsed = time.perf_counter() - t0
    rss = [rss_mb(p.pid) for p in procs.values() if p.poll() is None]
    for p in procs.values():  # stop every agent where it is: what is not stored must still be in its outbox
        p.kill()
        p.wait()
    lost = dup = pending = 0
    with store.read() as s:
        for i, dev_id in enumerate(ids):
            bodies = [b for _q, b in devices.uplink_bodies(s, dev_id, "result") if not b.get("final")]
            ast = AgentStore(tmp / dev_id / "agent.db")
            queued = {r.id for r in ast.pending(0, 10**9)}
            ast.close()
            got = [b["n"] for b in bodies if b.get("task_id") == f"backlog-{i}"]
            dup += len(got) - len(set(got))
            missing = set(range(per)) - set(got)
            pending += sum(1 for m in missing if f"backlog-{i}/r{m}" in queued)
            lost += sum(1 for m in missing if f"backlog-{i}/r{m}" not in queued)
            live = [b["n"] for b in bodies if b.get("task_id") == f"job-{i}.1"]
            dup += len(live) - len(set(live))
            if any(c[0] == f"job-{i}" and c[1] == "SUCCEEDED" for c in sink.calls):
                lost += task_results - len(set(live))  # a finished task's results must all be stored
    reported = [c for c in sink.calls if c[1] in ("SUCCEEDED", "FAILED")]
    twice = len(reported) - len({c[0] for c in reported})
    print(f"soak: {agents} agents, {want:,} results ({agents * per:,} backlog + {agents} live tasks x {task_results})"
          f", {kills['mosquitto']} Mosquitto kills, {kills['agent']} agent kill -9s, in {elapsed:.0f} s "
          f"({n / elapsed:,.0f} results/s); stored {n:,}, still queued on devices {pending:,}; "
          f"lost {lost}, stored twice {dup}, tasks reported "
          f"{len({c[0] for c in reported})}/{agents} (twice: {twice}); gateway duplicates {gw.duplicates}, "
          f"rejections {gw.rejections.counts}; agent RSS median {sorted(rss)[len(rss) // 2] if rss else 0:.0f} MB")
    ok = lost == 0 and dup == 0 and twice == 0
    complete = n >= want and len({c[0] for c in reported}) == agents
    print(f"SUMMARY edge soak: {'OK' if ok else 'FAILED'} ({'complete' if complete else 'time limit hit'}): "
          f"lost {lost}, duplicated {dup}, "
          f"{kills['mosquitto'] + kills['agent']} kills, {elapsed:.0f} s")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--backlog", type=int, default=100_000)
    ap.add_argument("--soak", action="store_true", help="run the soak (4.) instead")
    ap.add_argument("--agents", type=int, default=50)
    ap.add_argument("--task-results", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=900)
    ap.add_argument("--seed", type=int, default=13)
    args = ap.parse_args()
    if args.soak:
        tmp = Path(tempfile.mkdtemp(prefix="hb-edge-soak-"))
        try:
            ok = soak(tmp, agents=args.agents, backlog=args.backlog, task_results=args.task_results,
                      seconds=args.seconds, seed=args.seed)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        raise SystemExit(0 if ok else 1)
    mosq_bin = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(mosq_bin).exists():
        raise SystemExit("mosquitto is not installed: apt-get install -y mosquitto")
    tmp = Path(tempfile.mkdtemp(prefix="hb-edge-bench-"))
    procs: list[subprocess.Popen[bytes]] = []
    gw: Gateway | None = None
    try:
        ca = pki.CertificateAuthority.init(tmp / "ca")
        port = free_port()
        conf = write_config(tmp / "mqtt", ca_file=ca.directory / "ca.pem", cert_file=ca.directory / "server.pem",
                            key_file=ca.directory / "server.key", crl_file=ca.directory / "crl.pem",
                            config=MosquittoConfig(port=port, bind_address="127.0.0.1",
                                                   user="root" if os.geteuid() == 0 else None))
        procs.append(subprocess.Popen([mosq_bin, "-c", str(conf)], stderr=subprocess.DEVNULL))
        time.sleep(0.3)
        store = Store(f"sqlite:///{tmp / 'broker.db'}")
        upgrade(store.engine)

        def enroll(device_id: str, state: Path) -> tuple[Path, Path]:
            return enroll_device(store, ca, device_id, state)

        # 1. signed vs unsigned end to end
        dev = enroll("bench-dev", tmp / "bench-dev")
        plain = e2e_rate(args.messages, False, ca, dev, port)
        signed = e2e_rate(args.messages, True, ca, dev, port)
        print(f"e2e through mosquitto mTLS, QoS 1, 1 KB, n={args.messages}: unsigned {plain:,.0f} msg/s, "
              f"signed+verified {signed:,.0f} msg/s (ratio {signed / plain:.2f})")

        # 2./3. drain an offline backlog through the real agent and gateway
        state = tmp / "drain-dev"
        enroll("drain-dev", state)
        AgentConfig(state_dir=str(state), device_id="drain-dev", mqtt_port=port, heartbeat_seconds=5,
                    capacity_seconds=3600, retransmit_seconds=5, reconnect_max_seconds=1).save()
        ast = AgentStore(state / "agent.db")
        t0 = time.perf_counter()
        chunk = 5000
        for start in range(0, args.backlog, chunk):
            ast.put_many([("result", {"task_id": "bench", "n": i, "value": i}, f"bench/r{i}", False)
                          for i in range(start, min(start + chunk, args.backlog))])
        fill = time.perf_counter() - t0
        ast.close()
        print(f"outbox filled with {args.backlog:,} results in {fill:.1f} s ({args.backlog / fill:,.0f} rows/s)")
        gw = Gateway(store, host="127.0.0.1", port=port, ca_file=str(ca.directory / "ca.pem"),
                     cert_file=str(ca.directory / "gateway.pem"), key_file=str(ca.directory / "gateway.key"))
        gw.start()
        agent = subprocess.Popen([sys.executable, "-m", "edge.agent.cli", "--state-dir", str(state), "run"],
                                 env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.DEVNULL)
        procs.append(agent)
        t0 = time.perf_counter()
        peak = 0.0
        deadline = t0 + 180
        count_q = sa.text("SELECT COUNT(*) FROM edge_uplinks WHERE device_id='drain-dev' AND kind='result'")

        def stored() -> int:
            with store.engine.connect() as conn:
                return int(conn.execute(count_q).scalar_one())

        n = 0
        while n < args.backlog and time.perf_counter() < deadline:
            time.sleep(0.25)
            peak = max(peak, rss_mb(agent.pid))
            if gw.accepted >= args.backlog:
                n = stored()
        drain = time.perf_counter() - t0
        ok = n >= args.backlog
        print(f"drained {n:,}/{args.backlog:,} backlog results in {drain:.1f} s ({n / drain:,.0f} msg/s); "
              f"duplicates {gw.duplicates}, rejections {gw.rejections.counts}")
        time.sleep(5)
        idle = rss_mb(agent.pid)
        print(f"agent RSS: draining peak {peak:.1f} MB, idle {idle:.1f} MB (target <= 60 MB)")
        print(f"SUMMARY edge: e2e signed {signed:,.0f} msg/s ({signed / plain:.2f}x unsigned); "
              f"100k-style backlog {args.backlog:,} drained in {drain:.1f} s ({'OK' if ok and drain <= 60 else 'SLOW'}"
              f" vs 60 s); agent RSS peak {peak:.0f} MB, idle {idle:.0f} MB")
    finally:
        if gw is not None:
            gw.stop()
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
