"""The secure aggregation protocol: exact sums under dropouts, the threshold, and what the server sees."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from tensorfleet.federated.secure import Dropouts, Quantizer, TooFewSurvivorsError, run_round, shamir
from tensorfleet.federated.secure.client import SecAggClient, masks_of
from tensorfleet.federated.secure.graph import neighbours
from tensorfleet.federated.secure.keys import private_from_bytes
from tensorfleet.federated.secure.messages import (
    AdvertisedKeys,
    EncryptedShare,
    MaskedInput,
    RoundSettings,
    UnmaskingShares,
    UnmaskRequest,
)
from tensorfleet.federated.secure.server import SecAggServer

SECURE = Path(__file__).resolve().parents[2] / "tensorfleet" / "federated" / "secure"


def _settings(clients: int, size: int, *, bits: int = 16, degree: int | None = None, threshold: float = 0.5):
    return RoundSettings(round_num=3, size=size, quantizer=Quantizer(clip=1.0, bits=bits, clients=clients),
                         threshold=threshold, degree=degree, graph_seed=7)


def _quantized(updates, settings, uploading, seed):
    """The integers the uploading clients quantize to (they draw the rounding in id order from one rng)."""
    rng, out = np.random.default_rng(seed), {}
    for u in sorted(uploading):
        out[u] = settings.quantizer.quantize(updates[u], rng)[0]
        rng.random()  # the weight's rounding
    return out


# secagg+: 11 holders a secret, 4 shares needed, so any 6 of 20 may drop (a neighbourhood can lose them all).
@pytest.mark.parametrize("degree, threshold", [(None, 0.5), (10, 0.3)], ids=["secagg", "secagg+"])
@pytest.mark.parametrize("when", ["before_upload", "after_upload"])
@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.3])
def test_sum_is_exactly_the_integer_sum_of_the_arrived_vectors(degree, threshold, when, fraction):
    n, d = 20, 300
    settings = _settings(n, d, degree=degree, threshold=threshold)
    updates = np.random.default_rng(1).normal(0, 0.4, (n, d))
    gone = set(np.random.default_rng(2).choice(n, int(fraction * n), replace=False).tolist())
    total, view = run_round(list(updates), settings, dropouts=Dropouts(**{when: gone}),
                            rng=np.random.default_rng(5))
    arrived = set(range(n)) - gone if when == "before_upload" else set(range(n))
    ints = _quantized(updates, settings, arrived, 5)
    expected = sum(ints[u].astype(np.uint64) for u in arrived) % 2 ** 16
    assert total.clients == tuple(sorted(arrived))
    np.testing.assert_array_equal(total.values.astype(np.uint64), expected)
    assert len(view.masked) == len(arrived) and len(view.unmasking) == n - len(gone)


def test_sum_is_exact_at_62_bits_on_uint64_masks():
    settings = _settings(5, 64, bits=62)
    updates = list(np.random.default_rng(3).normal(0, 0.3, (5, 64)))
    total, _ = run_round(updates, settings, dropouts=Dropouts(before_upload={4}), rng=np.random.default_rng(9))
    ints = _quantized(updates, settings, range(4), 9)
    expected = [sum(int(ints[u][i]) for u in range(4)) % 2 ** 62 for i in range(64)]
    assert total.values.dtype == np.uint64 and total.values.tolist() == expected


def test_fewer_answers_than_the_threshold_fail_with_one_clear_error():
    settings = _settings(10, 20)  # secagg: each secret has 10 holders, 6 shares needed
    with pytest.raises(TooFewSurvivorsError, match=r"needs 6 shares of 10, and only 5 .* model unchanged"):
        run_round(list(np.zeros((10, 20))), settings, dropouts=Dropouts(after_upload=range(5)))
    total, _ = run_round(list(np.zeros((10, 20))), settings, dropouts=Dropouts(after_upload=range(4)))
    assert len(total.clients) == 10


def _most_dropouts_every_neighbourhood_survives(graph, most):
    """A maximal set of clients (taken in id order) with at most ``most`` in any client's holders (it and its
    neighbours): adding any other client leaves some neighbourhood short."""
    holders = [graph[u] | {u} for u in range(len(graph))]
    gone: set[int] = set()
    for u in range(len(graph)):
        if all(len(h & (gone | {u})) <= most for h in holders):
            gone.add(u)
    return gone, holders


@pytest.mark.parametrize("when", ["before_upload", "after_upload"])
def test_secagg_plus_unmasks_with_each_neighbourhood_at_its_threshold_and_fails_one_below(when):
    n, d = 20, 40
    settings = _settings(n, d, degree=4)  # 5 holders per secret, 3 needed: 2 of any neighbourhood may stop
    graph = neighbours(n, degree=4, seed=7)
    gone, holders = _most_dropouts_every_neighbourhood_survives(graph, most=2)
    assert any(len(h & gone) == 2 for h in holders)  # some neighbourhood is exactly at its threshold
    updates = list(np.random.default_rng(1).normal(0, 0.4, (n, d)))
    total, _ = run_round(updates, settings, dropouts=Dropouts(**{when: gone}), rng=np.random.default_rng(5))
    arrived = set(range(n)) - gone if when == "before_upload" else set(range(n))
    ints = _quantized(updates, settings, arrived, 5)
    assert total.clients == tuple(sorted(arrived))
    np.testing.assert_array_equal(total.values.astype(np.uint64),
                                  sum(ints[u].astype(np.uint64) for u in arrived) % 2 ** 16)
    # each client lies in 5 neighbourhoods, so 3 of every 5 answering is more than SecAgg's t = 11 of 20
    assert n - len(gone) >= 11
    one_more = gone | {min(set(range(n)) - gone)}
    short = [u for u in range(n) if len(holders[u] - one_more) < 3]  # the server rebuilds survivors' seeds first
    survivors = set(range(n)) - (one_more if when == "before_upload" else set())
    short_survivors = [u for u in short if u in survivors]
    first, secret = (min(short_survivors), "self-mask seed") if short_survivors else (min(short), "mask key")
    with pytest.raises(TooFewSurvivorsError, match=rf"client {first}'s {secret} needs 3 shares of 5, and only "
                                                   rf"{len(holders[first] - one_more)} .* model unchanged"):
        run_round(updates, settings, dropouts=Dropouts(**{when: one_more}), rng=np.random.default_rng(5))
    secagg, _ = run_round(updates, _settings(n, d), dropouts=Dropouts(**{when: one_more}))  # 11 of 20 needed
    assert len(secagg.clients) == (n if when == "after_upload" else n - len(one_more)) and n - len(one_more) >= 11
    crowded = {0, *sorted(graph[0])[:2]}  # 17 of 20 answer, but not enough of client 0's neighbourhood
    with pytest.raises(TooFewSurvivorsError, match="needs 3 shares of 5, and only 2"):
        run_round(updates, settings, dropouts=Dropouts(**{when: crowded}))
    secagg, _ = run_round(updates, _settings(n, d), dropouts=Dropouts(**{when: crowded}))
    assert len(secagg.clients) == (n if when == "after_upload" else n - 3)


def test_server_refuses_anything_but_messages():
    settings = _settings(3, 4)
    server = SecAggServer(settings)
    with pytest.raises(TypeError, match="public keys only as AdvertisedKeys messages. Received: ndarray"):
        server.receive_keys([np.zeros(4)])
    with pytest.raises(TypeError, match="masked vectors only as MaskedInput messages. Received: list"):
        server.receive_masked([[1, 2, 3]])


def test_server_side_never_imports_the_client_side():
    for name in ("server.py", "messages.py", "shamir.py", "graph.py", "keys.py", "quantize.py"):
        tree = ast.parse((SECURE / name).read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        assert not any(m and m.endswith("secure.client") for m in imported), name


def _correlation(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.corrcoef(a, b)[0, 1])


@pytest.fixture(scope="module")
def planted_round():
    n, d = 10, 4096
    settings = _settings(n, d, degree=None)
    rng = np.random.default_rng(11)
    updates = rng.normal(0, 0.2, (n, d))
    updates[0] = 0.9 * np.sin(np.arange(d) / 7.0)  # the planted update
    shared = np.random.default_rng(4)  # the clients draw their rounding from one generator, in id order
    clients = [SecAggClient(i, settings, shared) for i in range(n)]
    server = SecAggServer(settings)
    plans = server.receive_keys([c.advertise() for c in clients])
    routed = server.route_shares([s for plan in plans for s in clients[plan.client].share_keys(plan)])
    for c in clients:
        c.receive_shares(routed[c.client])
    request = server.receive_masked([c.masked_input(updates[c.client]) for c in clients])
    total = server.unmask([c.unmask(request) for c in clients])
    return settings, _quantized(updates, settings, range(n), 4), total, server.view, clients


def test_server_view_holds_only_messages_and_no_plaintext(planted_round):
    settings, ints, total, view, _ = planted_round
    kinds = {AdvertisedKeys, EncryptedShare, MaskedInput, UnmaskingShares}
    for item in [*view.keys, *view.shares, *view.masked, *view.unmasking]:
        assert type(item) in kinds
        for f in dataclasses.fields(item):
            assert isinstance(getattr(item, f.name), (int, bytes, np.ndarray, dict)), f.name
    bound = 5 / np.sqrt(settings.length)  # five standard deviations of the correlation of independent vectors
    # The server rebuilds every survivor's self-mask seed (it must, to unmask the sum): even without it the
    # vector stays under the pairwise masks.
    by_owner = {}
    for response in view.unmasking:
        for owner, share in response.self_mask_shares.items():
            by_owner.setdefault(owner, {})[response.client] = share
    for masked in view.masked:
        holders = sorted(by_owner[masked.client])[:6]
        seed = shamir.reconstruct([h + 1 for h in holders], np.stack([by_owner[masked.client][h] for h in holders]))
        self_only = masks_of(settings, masked.client, private_from_bytes(bytes(32)), {}, seed)
        for attempt in (masked.vector, settings.quantizer.reduce(masked.vector - self_only)):
            for u, true in ints.items():
                assert abs(_correlation(attempt[:-3], true)) < bound, (masked.client, u)
    expected = sum(v.astype(np.uint64) for v in ints.values()) % 2 ** 16
    np.testing.assert_array_equal(total.values, expected)


@pytest.mark.parametrize("colluders", [6, 5], ids=["t", "t-1"])
def test_t_colluding_shares_unmask_the_planted_update_and_fewer_cannot(planted_round, colluders):
    settings, ints, _, view, clients = planted_round
    server_seed = {}
    for response in view.unmasking:  # the self-mask seed of client 0, as the honest round revealed it
        server_seed.update({response.client: s for o, s in response.self_mask_shares.items() if o == 0})
    seed_holders = sorted(server_seed)[:6]
    seed = shamir.reconstruct([h + 1 for h in seed_holders], np.stack([server_seed[h] for h in seed_holders]))
    # Colluding clients hand over their shares of client 0's mask key (as if the server claimed 0 dropped).
    lie = UnmaskRequest(survivors=frozenset(), dropped=frozenset({0}))
    key_shares = {c.client: c.unmask(lie).key_shares[0] for c in clients[1:1 + colluders]}
    key = private_from_bytes(shamir.reconstruct([h + 1 for h in sorted(key_shares)],
                                                np.stack([key_shares[h] for h in sorted(key_shares)])))
    peers = {k.client: k.mask_public for k in view.keys if k.client != 0}
    masked = next(m for m in view.masked if m.client == 0)
    recovered = settings.quantizer.reduce(masked.vector - masks_of(settings, 0, key, peers, seed))[:-3]
    if colluders == 6:
        np.testing.assert_array_equal(recovered, ints[0])
    else:
        assert abs(_correlation(recovered, ints[0])) < 5 / np.sqrt(settings.length)
