"""The malicious-server variant (Bonawitz et al., CCS 2017, section 6): keys signed under a PKI and
a consistency round over the survivor list before any share is released."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tensorfleet.federated.aggregators import AGGREGATORS
from tensorfleet.federated.secure import Dropouts, InconsistentViewError, SecureAggregator
from tensorfleet.federated.secure.client import SecAggClient
from tensorfleet.federated.secure.keys import Identity
from tensorfleet.federated.secure.messages import NeighbourKeys, UnmaskRequest
from tensorfleet.federated.secure.protocol import make_clients, run_round
from tensorfleet.federated.secure.server import SecAggServer

UPDATES = list(np.random.default_rng(0).normal(0.0, 0.3, (7, 500)))


@pytest.mark.parametrize("kind", ["secagg", "secagg+"])
def test_an_honest_run_equals_the_semi_honest_sum_bit_for_bit(kind):
    honest = SecureAggregator(kind=kind, bits=20, degree=4 if kind == "secagg+" else None)
    malicious = dataclasses.replace(honest, malicious=True)
    dropouts = Dropouts(before_upload=[3], after_upload=[5])  # unmasking rebuilds a key and self seeds
    sums = []
    for aggregator in (honest, malicious):
        settings = aggregator.settings(7, 500, round_num=2)
        result, view = run_round(UPDATES, settings, dropouts=dropouts, rng=np.random.default_rng(4))
        sums.append(result)
        assert all(bool(k.signature) == settings.malicious for k in view.keys)
        assert len(view.signatures) == (5 if settings.malicious else 0)  # the survivors that answer sign
    np.testing.assert_array_equal(sums[0].total, sums[1].total)
    assert sums[0].clients == sums[1].clients == (0, 1, 2, 4, 5, 6)
    traffic = [aggregator.aggregate(UPDATES, round_num=2).traffic for aggregator in (honest, malicious)]
    assert (traffic[0].message_rounds, traffic[1].message_rounds) == (4, 5)
    assert traffic[1].upload > traffic[0].upload and traffic[1].download > traffic[0].download


def _until_upload(settings, clients):
    server = SecAggServer(settings)
    plans = server.receive_keys([c.advertise() for c in clients])
    routed = server.route_shares([share for plan in plans for share in clients[plan.client].share_keys(plan)])
    for c in clients:
        c.receive_shares(routed.get(c.client, []))
    request = server.receive_masked([c.masked_input(UPDATES[c.client]) for c in clients])
    return server, request


def test_a_server_showing_different_survivor_lists_makes_the_honest_clients_abort():
    settings = SecureAggregator(bits=20, malicious=True).settings(7, 500, round_num=1)
    clients = make_clients(7, settings, np.random.default_rng(1))
    server, request = _until_upload(settings, clients)
    victim = 6  # the server claims to client 0 that 6 dropped (its mask key) while 6 uploaded (its self seed)
    lie = UnmaskRequest(request.survivors - {victim}, request.dropped | {victim})
    shown = {c.client: lie if c.client == 0 else request for c in clients}
    signed = [c.sign_survivors(shown[c.client]) for c in clients]
    proof = server.consistency(signed)
    for c in clients:  # every signature forwarded: each client sees that another signed a different list
        with pytest.raises(InconsistentViewError, match=r"survivor lists differ .*; no share released"):
            c.unmask(shown[c.client], proof)
    assert server.view.unmasking == []
    # forwarding to each only the signatures over its own list: the lie gathers 1 signature of the 4 needed
    with pytest.raises(InconsistentViewError, match="1 do, 4 needed"):
        clients[0].unmask(lie, dataclasses.replace(proof, signatures={0: proof.signatures[0]}))
    others = {v: sig for v, sig in proof.signatures.items() if v != 0}
    released = [c.unmask(request, dataclasses.replace(proof, signatures=others)) for c in clients[1:]]
    assert all(victim not in r.key_shares for r in released)  # 6's mask key stays shared: its update stays masked
    # with one list for all, the same clients release their shares and the sum unmasks
    fresh = make_clients(7, settings, np.random.default_rng(1))
    server, request = _until_upload(settings, fresh)
    proof = server.consistency([c.sign_survivors(request) for c in fresh])
    assert server.unmask([c.unmask(request, proof) for c in fresh]).clients == tuple(range(7))


def test_a_forged_key_signature_is_refused_before_any_share_is_sent():
    settings = SecureAggregator(bits=20, malicious=True).settings(4, 500, round_num=0)
    clients = make_clients(4, settings, np.random.default_rng(2))
    server = SecAggServer(settings)
    plans = server.receive_keys([c.advertise() for c in clients])
    impostor = SecAggClient(2, settings, np.random.default_rng(3), identity=Identity.generate(),
                            pki={2: Identity.generate().public})
    forged = impostor.advertise()  # signed, but not by client 2's registered identity
    swapped = NeighbourKeys(0, tuple(forged if k.client == 2 else k for k in plans[0].keys))
    with pytest.raises(InconsistentViewError, match="keys given for client 2 are not signed by its registered"):
        clients[0].share_keys(swapped)
    substituted = NeighbourKeys(1, tuple(dataclasses.replace(k, mask_public=forged.mask_public) if k.client == 2
                                         else k for k in plans[1].keys))  # the right signature, another key
    with pytest.raises(InconsistentViewError, match="client 2"):
        clients[1].share_keys(substituted)
    assert clients[3].share_keys(plans[3])  # the keys as advertised pass


def test_malicious_needs_identities_and_a_majority_threshold():
    settings = SecureAggregator(malicious=True).settings(3, 10, round_num=0)
    with pytest.raises(ValueError, match="needs its identity and the registered public keys"):
        SecAggClient(0, settings, np.random.default_rng(0))
    with pytest.raises(ValueError, match="threshold >= 0.5"):
        SecureAggregator(malicious=True, threshold=0.3)
    with pytest.raises(ValueError, match="malicious must be true or false"):
        SecureAggregator(malicious="yes")
    options = dict(clients_per_round=4, seed=0, bits=16, clip=1.0, threshold=0.5, degree=0, noise_multiplier=0.0,
                   dp_clip=1.0, dp="central", dropout_after_upload=0.0)
    assert AGGREGATORS.get("secagg").compiled(**options, malicious="true").aggregator.malicious is True  # the CLI's
    with pytest.raises(ValueError, match="malicious must be true or false. Received: malicious='maybe'"):
        AGGREGATORS.get("secagg").compiled(**options, malicious="maybe")
