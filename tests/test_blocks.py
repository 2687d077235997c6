"""Skipping blocks: equal to a forward written by hand without the block; the model is restored."""
import pytest
import torch
from conftest import tiny_model

from zones.measure.blocks import BlockTrace, skip_blocks, zero_sublayer

pytestmark = pytest.mark.usefixtures("one_thread")


def causal_mask(length: int) -> torch.Tensor:
    """Additive (1, 1, T, T) mask: 0 on and below the diagonal, the dtype's min above it."""
    mask = torch.full((length, length), torch.finfo(torch.float32).min).triu(1)
    return mask[None, None]


def _first(output):
    return output[0] if isinstance(output, tuple) else output


def logits_without(model, ids: torch.Tensor, skipped: set[int]) -> torch.Tensor:
    """The model's forward written out with its own modules, leaving ``skipped`` blocks out."""
    length = ids.shape[1]
    positions = torch.arange(length)[None]
    mask = causal_mask(length)
    family = model.config.model_type
    with torch.inference_mode():
        if family == "llama":
            body = model.model
            hidden = body.embed_tokens(ids)
            rotary = body.rotary_emb(hidden, positions)
            for i, block in enumerate(body.layers):
                if i not in skipped:
                    hidden = _first(block(hidden, attention_mask=mask, position_ids=positions,
                                          position_embeddings=rotary))
            return model.lm_head(body.norm(hidden))
        if family == "gpt_neox":
            body = model.gpt_neox
            hidden = body.embed_in(ids)
            rotary = body.rotary_emb(hidden, positions)
            for i, block in enumerate(body.layers):
                if i not in skipped:
                    hidden = _first(block(hidden, attention_mask=mask, position_ids=positions,
                                          position_embeddings=rotary))
            return model.get_output_embeddings()(body.final_layer_norm(hidden))
        if family == "gpt2":
            body = model.transformer
            hidden = body.wte(ids) + body.wpe(positions)
            for i, block in enumerate(body.h):
                if i not in skipped:
                    hidden = _first(block(hidden, attention_mask=mask))
            return model.lm_head(body.ln_f(hidden))
    raise ValueError(family)


def model_logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids, use_cache=False).logits


@pytest.fixture
def ids():
    return torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))


def test_hand_written_forward_matches_the_model(family, ids):
    # The reference itself is right: with nothing skipped it is the model's forward.
    model = tiny_model(family)
    torch.testing.assert_close(logits_without(model, ids, set()), model_logits(model, ids),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("skipped", [{0}, {2}, {3}, {1, 2}])
def test_skip_blocks_equals_forward_without_them(family, ids, skipped):
    model = tiny_model(family)
    with skip_blocks(model, skipped):
        got = model_logits(model, ids)
    torch.testing.assert_close(got, logits_without(model, ids, skipped), rtol=1e-5, atol=1e-5)
    # ... and removing the block did change the output.
    assert (got - model_logits(model, ids)).abs().max() > 1e-2


def test_trace_resumes_from_the_middle(family, ids):
    model = tiny_model(family)
    trace = BlockTrace(model, ids)
    for skipped in ({0}, {2}, {1, 3}):
        torch.testing.assert_close(trace.logits_without(skipped), logits_without(model, ids, skipped),
                                   rtol=1e-5, atol=1e-5)


def state(model):
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def assert_restored(model, before_state, before_modules, ids, before_logits):
    after = model.state_dict()
    assert after.keys() == before_state.keys()
    for name, tensor in before_state.items():
        assert torch.equal(after[name], tensor), name
    assert [id(m) for m in model.modules()] == before_modules
    assert not any(m._forward_hooks for m in model.modules())
    assert torch.equal(model_logits(model, ids), before_logits)


@pytest.mark.parametrize("remove", ["block", "attn", "mlp"])
def test_model_bit_identical_after_exit(family, ids, remove):
    model = tiny_model(family)
    before = state(model), [id(m) for m in model.modules()], ids, model_logits(model, ids)

    def context():
        return skip_blocks(model, [1, 2]) if remove == "block" else zero_sublayer(model, 1, remove)

    with context():
        inside = model_logits(model, ids)
    assert not torch.equal(inside, before[-1])
    assert_restored(model, *before)

    with pytest.raises(RuntimeError, match="boom"):
        with context():
            model_logits(model, ids)
            raise RuntimeError("boom")
    assert_restored(model, *before)


def count_forwards(model):
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("bad", [[4], [-1], [0, 99]])
def test_bad_layer_index_fails_before_any_forward(bad):
    model = tiny_model("llama")
    calls = count_forwards(model)
    with pytest.raises(IndexError, match="out of range"):
        with skip_blocks(model, bad):
            model_logits(model, torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(IndexError, match="out of range"):
        with zero_sublayer(model, bad[-1], "attn"):
            model_logits(model, torch.zeros(1, 4, dtype=torch.long))
    assert calls == []


def test_bad_part_fails_before_any_forward():
    model = tiny_model("gpt2")
    calls = count_forwards(model)
    with pytest.raises(ValueError, match="part must be"):
        with zero_sublayer(model, 0, "ffn"):
            model_logits(model, torch.zeros(1, 4, dtype=torch.long))
    assert calls == []
