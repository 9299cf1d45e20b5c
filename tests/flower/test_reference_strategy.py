"""KFCAStrategy(reference=...): the server's own update as a peer at FlowerTune's two participants per round.

In-process grid (no Ray), the nodes of ``pooled_strategy_run`` (20 nodes, ``fraction_train=0.1``, node 4
flips). The reference is an honest update no node sent (the server's training on its clean rows).
"""

import random
import sqlite3

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is the optional extra kfca-llm[flower] (make install installs it)")

from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flower_local import LocalGrid, initial_arrays, pid  # noqa: E402
from pooled_strategy_run import FLIPPER, NODES, node, update  # noqa: E402

from kfca_llm import InputError  # noqa: E402
from kfca_llm.cli import main  # noqa: E402
from kfca_llm.flower import KFCAStrategy, read_ledger  # noqa: E402
from kfca_llm.flower.ledger import signs_path  # noqa: E402
from kfca_llm.flower.ledger_rows import sha256_hex  # noqa: E402
from kfca_llm.fl.reference import REFERENCE  # noqa: E402

ROUNDS, SERVER = 20, 99


class ServerUpdate:
    """Called once per round with the round's global arrays; returns the server's update of that round."""

    def __init__(self, broken=None):
        self.calls, self.broken = [], broken

    def __call__(self, global_arrays):
        self.calls.append(global_arrays)
        out = update(SERVER, len(self.calls))
        return out if self.broken is None else self.broken(out)


def run(reference, ledger=None, rounds=ROUNDS, **options):
    random.seed(7)  # FedAvg samples its nodes with the random module
    strategy = KFCAStrategy(FedAvg(fraction_train=0.1, fraction_evaluate=0.0), ledger=ledger, reference=reference,
                            min_peers=0, **options)
    result = strategy.start(grid=LocalGrid({n: node for n in range(1, NODES + 1)}), initial_arrays=initial_arrays(),
                            num_rounds=rounds)
    return strategy, result


def test_with_a_reference_and_no_pool_every_round_pays_the_flippers_partner_and_fines_the_flipper(tmp_path, capsys):
    reference = ServerUpdate()
    strategy, result = run(reference, tmp_path / "rewards.sqlite", keep_signs=True)
    assert len(reference.calls) == ROUNDS
    assert all(isinstance(a, np.ndarray) for a in reference.calls[0].values())
    met = 0
    for t, rewards in strategy.rewards.items():
        assert len(rewards) == 2 and REFERENCE not in rewards  # never paid
        if pid(FLIPPER) in rewards:
            (partner,) = set(rewards) - {pid(FLIPPER)}
            assert rewards[partner] > 0 > rewards[pid(FLIPPER)], (t, rewards)
            met += 1
    assert met >= 2
    assert strategy.undetermined == {t: () for t in strategy.rewards}
    assert all(result.train_metrics_clientapp[t]["kfca.undetermined"] == 0 for t in range(1, ROUNDS + 1))
    assert all(r.undetermined == () for r in read_ledger(tmp_path / "rewards.sqlite").rounds)
    # The run keeps signs: the reference's too (never paid), named in each round's row and hashed into the chain, so
    # verify scores every round against it again.
    ledger = tmp_path / "rewards.sqlite"
    rounds = read_ledger(ledger).rounds
    assert all(r.reference_sha256 is not None and signs_path(ledger, r.reference_sha256).is_file() for r in rounds)
    assert main(["verify", str(ledger)]) == 0
    assert f"{ROUNDS} match, 0 mismatch, 0 unverifiable" in capsys.readouterr().out


def test_a_tampered_or_missing_reference_sign_file_is_damaged_and_its_round_cell_breaks_the_chain(tmp_path, capsys):
    ledger = tmp_path / "rewards.sqlite"
    run(ServerUpdate(), ledger, rounds=4, keep_signs=True)
    rounds = read_ledger(ledger).rounds
    third = signs_path(ledger, rounds[2].reference_sha256)
    words = bytearray(third.read_bytes())
    words[0] ^= 1  # one sign of the reference flipped
    third.write_bytes(bytes(words))
    signs_path(ledger, rounds[3].reference_sha256).unlink()
    assert main(["verify", str(ledger)]) == 1
    out = capsys.readouterr().out
    assert "round 3: damaged (stored signs" in out and "do not hash to their name (file altered)" in out
    assert "round 4: damaged" in out and "missing" in out
    assert "2 match, 0 mismatch, 0 unverifiable, 2 damaged" in out
    # A reference scored with other signs than the ledger names: the flipped words under their own name fail the
    # rescoring (a mismatch), and renaming the round's reference in its row breaks the chain.
    third.write_bytes(bytes(words))
    altered = sha256_hex(bytes(words))
    signs_path(ledger, altered).write_bytes(bytes(words))
    with sqlite3.connect(ledger) as conn:
        conn.execute("UPDATE rounds SET reference_sha256 = ? WHERE round = 3", (altered,))
    main(["verify", str(ledger)])
    out = capsys.readouterr().out
    assert "round 3: mismatch" in out and "round 3: its rows do not hash to its chain hash (edited)" in out


def test_a_reference_round_recorded_without_its_signs_is_unverifiable_never_a_false_mismatch(tmp_path, capsys):
    """A ledger recorded before the reference's signs were kept (no reference_sha256): unverifiable."""
    ledger = tmp_path / "rewards.sqlite"
    run(ServerUpdate(), ledger, rounds=2, keep_signs=True)
    with sqlite3.connect(ledger) as conn:
        conn.execute("UPDATE rounds SET reference_sha256 = NULL")
    main(["verify", str(ledger)])
    out = capsys.readouterr().out
    assert "recorded without its signs" in out and "0 match, 0 mismatch, 2 unverifiable" in out


def test_reference_weight_zero_pays_as_without_a_reference_bit_for_bit():
    without, _ = run(None, rounds=8)
    weightless, _ = run(ServerUpdate(), rounds=8, reference_weight=0.0)
    assert weightless.rewards == without.rewards


def test_a_reference_update_of_the_wrong_shape_or_with_nan_is_a_clear_input_error():
    def misshapen(out):
        return {k: a[:1] for k, a in out.items()}

    def with_nan(out):
        name = sorted(out)[0]
        out[name] = out[name].copy()
        out[name].flat[0] = np.nan
        return out

    for broken, message in ((misshapen, "differs from the shared shape"), (with_nan, "NaN")):
        with pytest.raises(InputError, match=message) as error:
            run(ServerUpdate(broken), rounds=1)
        assert REFERENCE in str(error.value)
    with pytest.raises(InputError, match="reference must be a callable"):
        KFCAStrategy(FedAvg(), ledger=None, reference="server.py")
