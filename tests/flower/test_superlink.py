"""Real Flower processes with SuperNode authentication: payouts follow the registered key across restarts.

A ``flower-superlink`` with ``--enable-supernode-auth`` and TLS (a CA and a server certificate made here),
three SuperNode keys registered with ``flwr supernode register --name`` (alice, bob, carol), three
``flower-supernode`` processes, and a numpy app (written here) whose ServerApp wraps FedAvg in
``KFCAStrategy(identity="public-key", keep_signs=True)``.

Run 1 (2 rounds): after round 1 the ServerApp waits while the test stops alice's SuperNode and starts it
again with the same key (Flower 1.42 gives it back its node id: the SuperLink keeps one node id per
registered key, and refuses to register a key again after ``flwr supernode unregister``). Run 2: the
SuperLink restarts with a fresh (in-memory) state, the keys are registered again and every SuperNode comes
back under a new node id; its round (one) lands on the same participants. Each balance spans both node ids,
and ``kfca-llm verify`` recomputes all three rounds. One round on each side of each restart is all the
assertions need: every round costs a few seconds of SuperNode polling and a ClientApp process per node.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from kfca_llm.cli import main  # noqa: E402
from kfca_llm.flower import read_ledger  # noqa: E402
from kfca_llm.flower.identity import key_fingerprint  # noqa: E402

BIN = Path(sys.executable).parent
NAMES = ("alice", "bob", "carol")

APP = '''
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

SHAPES = {"dense.weight": (16, 24), "dense.bias": (16,)}
client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    partition = int(context.node_config["partition-id"])
    server_round = int(msg.content["config"]["server-round"])
    common = np.random.default_rng(1000 + server_round)
    own = np.random.default_rng(partition * 7919 + server_round)
    sign = -1.0 if partition == 2 else 1.0  # carol flips her update
    sent = {k: a.numpy() for k, a in msg.content["arrays"].items()}
    out = {k: (sent[k] + sign * 0.01 * (common.standard_normal(s) + 0.8 * own.standard_normal(s))).astype(np.float32)
           for k, s in SHAPES.items()}
    content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in out.items()}),
                          "metrics": MetricRecord({"num-examples": 10 + partition})})
    return Message(content=content, reply_to=msg)


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    from kfca_llm.flower import KFCAStrategy

    config = context.run_config
    strategy = KFCAStrategy(FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=3,
                                   min_available_nodes=3),
                            ledger=config["ledger"], identity="public-key", keep_signs=True)

    def pause_after_round_1(server_round, arrays):
        if server_round == 1 and config["pause"]:
            Path(config["pause-file"]).write_text("1")
            deadline = time.time() + 300
            while not Path(config["go-file"]).exists() and time.time() < deadline:
                time.sleep(0.2)

    rng = np.random.default_rng(0)
    initial = ArrayRecord({k: Array(rng.standard_normal(s).astype(np.float32)) for k, s in SHAPES.items()})
    strategy.start(grid=grid, initial_arrays=initial, num_rounds=int(config["num-rounds"]),
                   evaluate_fn=pause_after_round_1, timeout=180)
'''

PYPROJECT = '''
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "kfca-numpy-app"
version = "1.0.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "kfca-test"

[tool.flwr.app.components]
serverapp = "numpy_app:server_app"
clientapp = "numpy_app:client_app"

[tool.flwr.app.config]
num-rounds = 2
pause = true
ledger = "{ledger}"
pause-file = "{pause}"
go-file = "{go}"
'''


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def make_keys(folder: Path) -> None:
    """A CA, a server certificate for 127.0.0.1, and three SuperNode key pairs (P-384, OpenSSH format)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    valid = dict(not_valid_before=now - datetime.timedelta(minutes=5), not_valid_after=now + datetime.timedelta(days=1))

    def certificate(subject, issuer, public_key, signing_key, extension, critical):
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
                   .serial_number(x509.random_serial_number()).not_valid_before(valid["not_valid_before"])
                   .not_valid_after(valid["not_valid_after"]).add_extension(extension, critical=critical))
        return builder.sign(signing_key, hashes.SHA256())

    pem = serialization.Encoding.PEM
    ca_key, server_key = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kfca test CA")])
    ca = certificate(ca_name, ca_name, ca_key.public_key(), ca_key, x509.BasicConstraints(ca=True, path_length=None),
                     True)
    server = certificate(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]), ca_name,
                         server_key.public_key(), ca_key,
                         x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                      x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
    (folder / "ca.crt").write_bytes(ca.public_bytes(pem))
    (folder / "server.pem").write_bytes(server.public_bytes(pem))
    (folder / "server.key").write_bytes(server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                                 serialization.NoEncryption()))
    for name in NAMES:
        key = ec.generate_private_key(ec.SECP384R1())
        (folder / name).write_bytes(key.private_bytes(pem, serialization.PrivateFormat.OpenSSH,
                                                      serialization.NoEncryption()))
        (folder / f"{name}.pub").write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                                            serialization.PublicFormat.OpenSSH))


class Processes:
    """Started processes (each in its own session), stopped group by group at the end."""

    def __init__(self, folder: Path, env: dict):
        self.folder, self.env, self.started = folder, env, {}

    def start(self, name: str, *command: str) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "ab")
        proc = subprocess.Popen(command, cwd=self.folder, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.started[name] = proc
        return proc

    def stop(self, name: str) -> None:
        proc = self.started.pop(name)
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                time.sleep(1)  # children of the session (SuperExec) leave with their parent
                os.killpg(proc.pid, signal.SIGKILL)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                continue
            return

    def stop_all(self) -> None:
        """All at once (stopped one by one, each would wait for its own exit and then its children's second)."""
        procs = [self.started.pop(name) for name in list(self.started)]
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            for proc in procs:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + wait
            for proc in procs:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    pass
            if all(proc.poll() is not None for proc in procs):
                break
        time.sleep(1)  # children of the sessions (SuperExec) leave with their parents
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def flwr(env: dict, folder: Path, *args: str) -> str:
    done = subprocess.run([str(BIN / "flwr"), *args], cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def wait_for(predicate, seconds: float, what: str) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def registered_id(output: str) -> str:
    return re.search(r"SuperNode (\d+) registered", output).group(1)


def test_authenticated_supernodes_are_paid_by_key_and_a_restart_under_a_new_node_id_keeps_the_balance(tmp_path):
    folder = tmp_path
    keys = folder / "keys"
    keys.mkdir()
    make_keys(keys)
    link_port, *node_ports = free_ports(4)
    home = folder / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(f'[superlink]\ndefault = "local"\n\n[superlink.local]\n'
                                      f'address = "127.0.0.1:{link_port}"\nroot-certificates = "{keys / "ca.crt"}"\n')
    app = folder / "app"
    app.mkdir()
    ledger, pause, go = folder / "rewards.sqlite", folder / "paused", folder / "go"
    (app / "numpy_app.py").write_text(APP)
    (app / "pyproject.toml").write_text(PYPROJECT.format(ledger=ledger, pause=pause, go=go))
    env = {**os.environ, "FLWR_HOME": str(home), "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           # the SuperExecs (the SuperLink's, each SuperNode's) ask for a new app process to start every 0.2 s
           # instead of every second: a ClientApp process starts for every message
           "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2"}
    procs = Processes(folder, env)

    def supernode(name: str, partition: int) -> None:
        procs.start(name, str(BIN / "flower-supernode"), "--superlink", f"127.0.0.1:{link_port}",
                    "--root-certificates", str(keys / "ca.crt"), "--auth-supernode-private-key", str(keys / name),
                    "--port", str(node_ports[partition]), "--node-config", f"partition-id={partition}")

    def superlink() -> None:
        procs.start("superlink", str(BIN / "flower-superlink"), "--ssl-ca-certfile", str(keys / "ca.crt"),
                    "--ssl-certfile", str(keys / "server.pem"), "--ssl-keyfile", str(keys / "server.key"),
                    "--enable-supernode-auth", "--port", str(link_port), "--disable-runtime-dependency-installation")

    def register(*names: str, ids: dict) -> bool:
        """``flwr supernode register`` for each name not in ``ids`` yet, side by side; whether all of them are
        registered. All three at once, retried until the SuperLink answers: one CLI start (seconds) per attempt,
        not one for the first name and another for the rest."""
        commands = {name: subprocess.Popen([str(BIN / "flwr"), "supernode", "register", str(keys / f"{name}.pub"),
                                            "local", "--name", name], cwd=folder, env=env, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True) for name in names if name not in ids}
        for name, command in commands.items():
            output = command.communicate(timeout=120)[0]
            if "registered successfully" in output:
                ids[name] = registered_id(output)
        return all(name in ids for name in names)

    def started(name: str) -> bool:
        return (folder / f"{name}.log").read_text(errors="replace").count("SuperNode ID") >= starts[name]

    first, second, starts = {}, {}, dict.fromkeys(NAMES, 1)
    try:
        superlink()
        wait_for(lambda: register(*NAMES, ids=first), 120, "the SuperLink to accept registrations")
        for partition, name in enumerate(NAMES):
            supernode(name, partition)
        run = procs.start("run", str(BIN / "flwr"), "run", str(app), "local", "--stream")
        wait_for(pause.exists, 300, "round 1 to finish")
        procs.stop("alice")  # a SuperNode restarted mid-run
        assert not register("alice", ids={})  # the key is registered already: no second node id for it
        supernode("alice", 0)
        starts["alice"] += 1
        wait_for(lambda: started("alice"), 120, "alice's SuperNode to start again")
        go.write_text("go")
        assert run.wait(timeout=300) == 0
        wait_for(lambda: len(read_ledger(ledger).rounds) == 2, 60, "round 2 in the ledger")

        procs.stop_all()  # the SuperLink's in-memory state (registrations, node ids) is gone
        superlink()
        wait_for(lambda: register(*NAMES, ids=second), 120, "the restarted SuperLink")
        for partition, name in enumerate(NAMES):
            supernode(name, partition)
        run = procs.start("run2", str(BIN / "flwr"), "run", str(app), "local", "--stream", "--run-config",
                          "num-rounds=1 pause=false")
        assert run.wait(timeout=300) == 0
    finally:
        procs.stop_all()

    contents = read_ledger(ledger)
    assert [r.round for r in contents.rounds] == [1, 2, 1] and contents.failures == []
    assert len({r.run_id for r in contents.rounds}) == 2
    assert not set(first.values()) & set(second.values())  # every node id changed with the SuperLink's state
    fingerprint = {name: key_fingerprint(_registered_key(keys / f"{name}.pub")) for name in NAMES}
    for name in NAMES:
        rows = [(r.round, r.node_id) for r in contents.rewards if r.participant == f"key:{fingerprint[name]}"]
        assert rows == [(1, first[name]), (2, first[name]), (1, second[name])], name
    assert {p.participant: p.label for p in contents.participants} == {f"key:{fingerprint[n]}": n for n in NAMES}
    assert contents.totals()[f"key:{fingerprint['carol']}"] < -0.3  # the flipper
    assert main(["verify", str(ledger)]) == 0


def _registered_key(path: Path) -> bytes:
    """The public key as the SuperLink stores and reports it (PEM SubjectPublicKeyInfo of the OpenSSH key)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_ssh_public_key(path.read_bytes())
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
