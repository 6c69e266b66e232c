"""Shared fixtures: tiny dictionaries and configurations, and paths to the real sample data."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import user_plugin  # noqa: E402,F401  (registers the plugin)
from fairseq.data import Dictionary  # noqa: E402

SHARED_DATA = Path(os.environ.get("VASWANI_SHARED_DATA", REPO.parent / "shared" / "data"))
MULTI30K = SHARED_DATA / "multi30k-en-de"


def require_data(path: Path) -> Path:
    """Skip the calling test, with the reason, when the real sample data is absent."""
    if not path.exists():
        pytest.skip(f"real sample data not found at {path} (set VASWANI_SHARED_DATA)")
    return path


def make_dictionary(num_types: int) -> Dictionary:
    """A fairseq dictionary with the 4 special symbols plus ``num_types - 4`` dummy words."""
    dictionary = Dictionary()
    for i in range(num_types - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    return dictionary


def fake_task(src: Dictionary, tgt: Dictionary | None = None) -> SimpleNamespace:
    return SimpleNamespace(source_dictionary=src, target_dictionary=tgt or src)


def model_args(arch: str, **overrides) -> argparse.Namespace:
    """What fairseq-train would hand the model: the arch's defaults under the user's options."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    args = argparse.Namespace(**overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def build_vaswani(dictionary: Dictionary, arch: str = "vaswani_base", **overrides):
    from user_plugin.models.transformer_config import VaswaniTransformerConfig
    from user_plugin.models.vaswani_transformer import VaswaniTransformerModel

    cfg = VaswaniTransformerConfig.from_namespace(model_args(arch, **overrides))
    return VaswaniTransformerModel.build_model(cfg, fake_task(dictionary))


TINY = dict(
    encoder_layers=2,
    decoder_layers=2,
    encoder_embed_dim=32,
    decoder_embed_dim=32,
    encoder_ffn_embed_dim=64,
    decoder_ffn_embed_dim=64,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    dropout=0.0,
    share_all_embeddings=True,
)


def random_batch(dictionary: Dictionary, batch: int = 3, src_len: int = 7, tgt_len: int = 6,
                 seed: int = 0):
    """Left-padded sources and right-padded targets of random lengths, as fairseq batches them."""
    gen = torch.Generator().manual_seed(seed)
    nspecial = dictionary.nspecial
    pad, eos = dictionary.pad(), dictionary.eos()
    src = torch.full((batch, src_len), pad, dtype=torch.long)
    prev = torch.full((batch, tgt_len), pad, dtype=torch.long)
    src_lengths = torch.randint(2, src_len + 1, (batch,), generator=gen)
    src_lengths[0] = src_len
    tgt_lengths = torch.randint(2, tgt_len + 1, (batch,), generator=gen)
    tgt_lengths[0] = tgt_len
    for i in range(batch):
        n = int(src_lengths[i])
        src[i, src_len - n:] = torch.randint(nspecial, len(dictionary), (n,), generator=gen)
        src[i, -1] = eos
        m = int(tgt_lengths[i])
        prev[i, :m] = torch.randint(nspecial, len(dictionary), (m,), generator=gen)
        prev[i, 0] = eos
    return src, src_lengths, prev
