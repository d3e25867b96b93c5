"""Transformer workloads: known models' real shapes and counts, and Korthikanti et al.'s activations."""

from __future__ import annotations

from fractions import Fraction

import pytest

from tensorfleet.planner import workload as W
from tensorfleet.registry import UnknownNameError

# name: (layers, hidden, heads, seq_len, vocab, parameters as published by the models' authors'
# checkpoints: GPT-2 124M/355M/774M/1.5B, BERT base/large 110M/340M, GPT-3 "175B").
KNOWN = {
    "gpt2": (12, 768, 12, 1024, 50257, 124_439_808),
    "gpt2-medium": (24, 1024, 16, 1024, 50257, 354_823_168),
    "gpt2-large": (36, 1280, 20, 1024, 50257, 774_030_080),
    "gpt2-xl": (48, 1600, 25, 1024, 50257, 1_557_611_200),
    "gpt3-175b": (96, 12288, 96, 2048, 50257, 174_604_259_328),
    "bert-base": (12, 768, 12, 512, 30522, 109_482_240),
    "bert-large": (24, 1024, 16, 512, 30522, 335_141_888),
}


def _paper(s: int, b: int, h: int, a: int) -> int:
    """Korthikanti et al. 2022, Eq. 1: bytes of one transformer layer's activations at 16 bits."""
    return int(s * b * h * (34 + Fraction(5 * a * s, h)))  # exact: a whole number of bytes for these shapes


@pytest.mark.parametrize("name", list(KNOWN))
def test_presets_have_the_real_shapes_and_parameter_counts(name):
    layers, hidden, heads, seq_len, vocab, parameters = KNOWN[name]
    shape = W.TRANSFORMERS.get(name)
    assert (shape.layers, shape.hidden, shape.heads, shape.seq_len, shape.vocab) == (layers, hidden, heads, seq_len,
                                                                                      vocab)
    work = W.preset_workload(name)
    assert work.parameters == shape.parameters == parameters
    assert sum(work.layer_parameters) == parameters  # embeddings counted with the first layer
    assert len(work.layer_parameters) == layers


@pytest.mark.parametrize("name", list(KNOWN))
def test_each_layer_holds_the_activations_of_the_papers_formula(name):
    layers, hidden, heads, seq_len, vocab, _ = KNOWN[name]
    per_layer = _paper(seq_len, 1, hidden, heads)
    assert W.layer_activation_bytes(seq_len=seq_len, hidden=hidden, heads=heads) == per_layer
    acts = [v * 2 for v in W.preset_workload(name).layer_activations]  # 16-bit values -> bytes
    assert acts[1:-1] == [per_layer] * (layers - 2)
    # Section 4.3: the embeddings' dropout mask (sbh) first; final LayerNorm and projection (4sbh) and
    # the 32-bit cross-entropy (4sbv) last.
    assert acts[0] == per_layer + seq_len * hidden
    assert acts[-1] == per_layer + 4 * seq_len * hidden + 4 * seq_len * vocab


def test_gpt2_xl_at_1024_tokens_needs_8_97_gb_in_its_layers_not_5_69():
    assert W.layer_activation_bytes(seq_len=1024, hidden=1600, heads=25) == 1024 * 1600 * 114 == 186_777_600
    assert 48 * 186_777_600 == 8_965_324_800
    # hidden // 128 = 12 heads, the old assumption: 118,620,160 bytes per layer, 5.69 GB in all.
    assert 48 * W.layer_activation_bytes(seq_len=1024, hidden=1600, heads=12) == 5_693_767_680
    work = W.preset_workload("gpt2-xl")
    assert sum(work.layer_activations) * 2 == 8_965_324_800 + 5 * 1024 * 1600 + 4 * 1024 * 50257 == 9_179_369_472
    assert W.layer_activation_bytes(seq_len=1024, hidden=1600, heads=25, batch=4) == 4 * 186_777_600


def test_a_shorter_sequence_scales_the_activations_and_a_longer_one_is_refused():
    work = W.preset_workload("bert-base", seq_len=128)
    assert work.parameters == 109_482_240  # the position table stays 512 long
    assert work.layer_activations[5] * 2 == _paper(128, 1, 768, 12) == 128 * 768 * 34 + 5 * 12 * 128**2
    assert work.flops_per_example == 6 * 109_482_240 * 128
    with pytest.raises(ValueError, match=r"^bert_base takes sequences of at most 512 tokens \(its position table\). "
                                         r"Received: seq_len=1024$"):
        W.preset_workload("bert-base", seq_len=1024)
    with pytest.raises(UnknownNameError, match="Unknown transformer 'gpt2-xxl'. Did you mean 'gpt2_xl'?"):
        W.preset_workload("gpt2-xxl")


def test_a_transformer_by_count_takes_its_heads_and_needs_them_with_its_hidden_size():
    work = W.transformer_workload(1.5e9, layers=48, hidden=1600, heads=25, seq_len=1024)
    assert work.layer_activations[1] * 2 == 186_777_600
    assert (work.shape.heads, work.shape.hidden, work.shape.layers) == (25, 1600, 48)
    with pytest.raises(ValueError, match=r"^Give hidden and heads together: .* Received: hidden=1600, heads=None; "
                                         r"known models have presets: gpt2, gpt2_medium"):
        W.transformer_workload(1.5e9, layers=48, hidden=1600)
    with pytest.raises(ValueError, match=r"^hidden must be a multiple of heads .* Received: hidden=1600, heads=12$"):
        W.transformer_workload(1.5e9, hidden=1600, heads=12)
    # With no shape given, the assumed GPT-3-like shape has 128-wide heads.
    assumed = W.transformer_workload(175e9, seq_len=2048).shape
    assert (assumed.layers, assumed.hidden, assumed.heads) == (96, 12325, 96)


def test_the_shape_planned_for_is_shown_and_an_assumed_one_says_so():
    assert W.preset_workload("bert-base",
                             seq_len=128).describe_shape() == "12 layers, hidden 768, 12 heads, seq_len 128"
    assert W.transformer_workload(1.5e9).describe_shape() == (
        "20 layers, hidden 2500, 19 heads, seq_len 1024; shape assumed GPT-3-like, give layers, hidden and heads")
    assert W.transformer_workload(1.5e9, layers=48, hidden=1600, heads=25).describe_shape() == (
        "48 layers, hidden 1600, 25 heads, seq_len 1024")
