"""Export one of our checkpoints to Hugging Face transformers: ``from_pretrained`` loads it with
no code of ours.

Two classes hold the paper's post-norm Transformer (§3.1) exactly:

* **MarianMTModel** (with ``MarianTokenizer``) for SentencePiece models with sinusoidal positions
  (§3.5, the EN-FR word pieces). Marian recomputes its sinusoids at load time with the paper's
  frequencies, sines in the first half of the channels and cosines in the second, where ours
  interleave them. Attention, the feed-forward layers and LayerNorm commute with a permutation
  of the d_model basis, so the whole residual stream is permuted to Marian's layout
  (:func:`marian_permutation`): the input columns of every embedding, the output projection and
  the q/k/v and fc1 weights, the output rows and biases of out_proj and fc2, and both LayerNorm
  vectors. Marian's positions are not padding-aware: batches are right-padded, as its tokenizer
  pads.
* **FSMTForConditionalGeneration** (fairseq's own layout in transformers) for BPE models and
  for learned positions (Table 3 row E): its positions are a stored table with fairseq's
  ``padding_idx + 1`` offset, so our table (sinusoids or learned) is stored as it is. A BPE
  model ships ``FSMTTokenizer`` files built from our BPE codes and dictionaries; its Moses step
  escapes ``'`` and ``"``, which ours does not, so the merges first join each Moses entity into
  one symbol and spell our pieces with entities (:func:`fsmt_merges`; docs/export.md measures
  the id agreement).

Both get the weights of fairseq's built-in ``transformer`` that the fairseq export builds
(:func:`~user_plugin.artifacts.builtin_transformer.to_builtin_transformer`), the special ids of
fairseq's dictionaries (pad 1, EOS 2 also starting the decoder), and the paper's beam size in
``generation_config``. Every export also carries the exact tokenization route (the text
pipeline record, its subword model and our vocabularies:
:class:`~user_plugin.artifacts.transformers_layout.ExportTokenizer`).

Refused with one line and nothing written: pre-norm models and the options Marian and FSMT lack
(no positions, layer norm on embeddings, cross-self-attention, adaptive softmax, a decoder
output dimension), d_k or d_v other than d_model / h (Table 3 row B), extensions.

The directory is written beside the output, loaded back by ``from_pretrained`` and checked to
give our log-probabilities on a test batch (:data:`VERIFY_TOLERANCE`) before it is moved into
place.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..artifacts.builtin_transformer import to_builtin_transformer
from ..artifacts.errors import ArtifactError
from ..artifacts.our_model import load_our_model, probe_batch
from ..artifacts.text_pipeline import TextPipeline
from ..artifacts.transformers_layout import (
    FORMAT,
    SOURCE_VOCAB,
    TARGET_VOCAB,
    check_transformers_export,
    require_transformers,
)
from ..artifacts.written_directory import ExportedDirectory, refuse_foreign_output, write_export
from ..paper import BEAM, LENPEN

#: Largest difference allowed between our and the exported model's log-probabilities.
VERIFY_TOLERANCE = 1e-4


def transformers_refusal(theirs: nn.Module) -> str | None:
    """Why neither Marian nor FSMT can hold fairseq's ``transformer`` ``theirs`` exactly, or
    None when they can."""
    cfg = theirs.cfg
    encoder, decoder = theirs.encoder, theirs.decoder
    if cfg.encoder.normalize_before or cfg.decoder.normalize_before:
        return ("pre-norm models (--encoder/--decoder-normalize-before) have no class in "
                "transformers: Marian and FSMT are post-norm")
    unsupported = {
        "--no-token-positional-embeddings": cfg.no_token_positional_embeddings,
        "--layernorm-embedding": cfg.layernorm_embedding,
        "--cross-self-attention": cfg.cross_self_attention,
        "--no-cross-attention": cfg.no_cross_attention,
        "--adaptive-softmax-cutoff": cfg.adaptive_softmax_cutoff is not None,
        "--decoder-output-dim": decoder.project_out_dim is not None,
        "--no-scale-embedding": cfg.no_scale_embedding,
    }
    for option, used in unsupported.items():
        if used:
            return f"transformers' Marian and FSMT have no {option}"
    if cfg.encoder.embed_dim != cfg.decoder.embed_dim:
        return "transformers' Marian and FSMT need one d_model for encoder and decoder"
    if encoder.max_positions() != decoder.max_positions():
        return ("transformers' Marian and FSMT need --max-source-positions equal to "
                "--max-target-positions")
    return None


def marian_permutation(d_model: int) -> torch.Tensor:
    """Channel ``j`` of Marian's layout is channel ``perm[j]`` of ours: the even (sine)
    channels first, then the odd (cosine) ones."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def permuted(name: str, tensor: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """A weight of fairseq's transformer in Marian's d_model basis (module docstring)."""
    leaf = name.rsplit(".", 2)[-2:]
    module, kind = leaf[0], leaf[1]
    if module in ("embed_tokens", "output_projection", "q_proj", "k_proj", "v_proj", "fc1"):
        return tensor[:, perm] if kind == "weight" else tensor
    if module in ("out_proj", "fc2"):
        return tensor[perm] if kind == "weight" else tensor[perm]
    if module.endswith("layer_norm"):
        return tensor[perm]
    raise ArtifactError(f"no Marian counterpart for parameter {name}")


def layer_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """fairseq's per-layer weights (``encoder.layers.*``, ``decoder.layers.*``)."""
    return {name: value for name, value in state.items() if ".layers." in name}


def marian_state(theirs: nn.Module, shared: bool, tied: bool) -> dict[str, torch.Tensor]:
    """Marian's state dict of fairseq's ``transformer`` ``theirs`` (module docstring)."""
    state = theirs.state_dict()
    perm = marian_permutation(theirs.cfg.encoder.embed_dim)
    out = {f"model.{name}": permuted(name, value, perm)
           for name, value in layer_weights(state).items()}
    encoder = permuted("encoder.embed_tokens.weight", state["encoder.embed_tokens.weight"], perm)
    decoder = permuted("decoder.embed_tokens.weight", state["decoder.embed_tokens.weight"], perm)
    if shared:
        out["model.shared.weight"] = encoder
    out["model.encoder.embed_tokens.weight"] = encoder
    out["model.decoder.embed_tokens.weight"] = decoder
    out["lm_head.weight"] = decoder if tied else permuted(
        "decoder.output_projection.weight", state["decoder.output_projection.weight"], perm)
    out["final_logits_bias"] = torch.zeros(1, decoder.size(0))
    return out


def fsmt_state(theirs: nn.Module) -> dict[str, torch.Tensor]:
    """FSMT's state dict of fairseq's ``transformer`` ``theirs``: fairseq's names under
    ``model.``, the position tables included."""
    state = theirs.state_dict()
    return {f"model.{name}": value for name, value in state.items()
            if not name.endswith(".version") and "_float_tensor" not in name}


def common_config(theirs: nn.Module, task: Any) -> dict[str, Any]:
    """The configuration entries Marian and FSMT share."""
    cfg = theirs.cfg
    return dict(
        d_model=cfg.encoder.embed_dim, encoder_layers=len(theirs.encoder.layers),
        decoder_layers=len(theirs.decoder.layers),
        encoder_attention_heads=cfg.encoder.attention_heads,
        decoder_attention_heads=cfg.decoder.attention_heads,
        encoder_ffn_dim=cfg.encoder.ffn_embed_dim, decoder_ffn_dim=cfg.decoder.ffn_embed_dim,
        activation_function=str(cfg.activation_fn), dropout=float(cfg.dropout),
        attention_dropout=float(cfg.attention_dropout),
        activation_dropout=float(cfg.activation_dropout), scale_embedding=True,
        pad_token_id=task.target_dictionary.pad(), eos_token_id=task.target_dictionary.eos(),
        bos_token_id=task.target_dictionary.bos(),
        decoder_start_token_id=task.target_dictionary.eos(),
        forced_eos_token_id=task.target_dictionary.eos(),
    )


def build_hf_model(theirs: nn.Module, task: Any, marian: bool):
    """The transformers model (Marian or FSMT) holding ``theirs``' weights, in eval mode."""
    transformers = require_transformers()
    cfg = theirs.cfg
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    shared = bool(cfg.share_all_embeddings)
    tied = bool(cfg.share_decoder_input_output_embed)
    common = common_config(theirs, task)
    if common["activation_function"] not in transformers.activations.ACT2FN:
        raise ArtifactError(f"transformers has no activation {common['activation_function']!r}")
    if marian:
        config = transformers.MarianConfig(
            vocab_size=len(src_dict), decoder_vocab_size=len(tgt_dict),
            max_position_embeddings=theirs.encoder.max_positions(),
            share_encoder_decoder_embeddings=shared, tie_word_embeddings=tied, **common)
        model = transformers.MarianMTModel(config)
        state = marian_state(theirs, shared, tied)
    else:
        if shared != tied and shared:
            raise ArtifactError("FSMT ties all embeddings or none")
        config = transformers.FSMTConfig(
            langs=[task.cfg.source_lang, task.cfg.target_lang], src_vocab_size=len(src_dict),
            tgt_vocab_size=len(tgt_dict), max_position_embeddings=theirs.encoder.max_positions(),
            tie_word_embeddings=shared, **common)
        model = transformers.FSMTForConditionalGeneration(config)
        state = fsmt_state(theirs)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state) - ignorable_missing(model))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ArtifactError(f"{type(model).__name__} does not fit the checkpoint "
                            f"(missing {missing[:2]}, unexpected {unexpected[:2]})")
    for name, value in state.items():
        if expected[name].shape != value.shape:
            raise ArtifactError(f"{type(model).__name__}.{name}: shape "
                                f"{list(expected[name].shape)}, the checkpoint's "
                                f"{list(value.shape)}")
    model.load_state_dict(state, strict=False)
    model.generation_config.num_beams = BEAM
    model.generation_config.max_length = theirs.decoder.max_positions()
    model.generation_config.bad_words_ids = [[tgt_dict.pad()]]
    return model.eval()


def ignorable_missing(model: nn.Module) -> set[str]:
    """Parameters the model computes itself (Marian's sinusoids)."""
    return {name for name in model.state_dict() if name.endswith("embed_positions.weight")
            and type(model).__name__ == "MarianMTModel"}


def hf_log_probs(model: nn.Module, src: torch.Tensor, prev: torch.Tensor, pad: int,
                 ) -> torch.Tensor:
    """The transformers model's next-token log-probabilities, teacher-forced, on a
    right-padded source batch ``src`` and decoder input ``prev``."""
    with torch.no_grad():
        logits = model(input_ids=src, attention_mask=src.ne(pad).long(),
                       decoder_input_ids=prev, use_cache=False).logits
    return torch.log_softmax(logits.float(), dim=-1)


def right_padded(src: torch.Tensor, pad: int) -> torch.Tensor:
    """A left-padded batch (fairseq's) with each row's tokens moved to the left."""
    out = torch.full_like(src, pad)
    for i, row in enumerate(src):
        tokens = row[row.ne(pad)]
        out[i, : tokens.numel()] = tokens
    return out


def max_difference(ours: nn.Module, model: nn.Module, task: Any) -> float:
    """Largest difference of our and the transformers model's next-token log-probabilities
    on :func:`probe_batch` (one sentence left-padded for ours, right-padded for theirs)."""
    src, lengths, _ = probe_batch(task.source_dictionary)
    _, _, prev = probe_batch(task.target_dictionary)
    with torch.no_grad():
        ours_lp = torch.log_softmax(ours(src, lengths, prev)[0].float(), dim=-1)
    pad = task.source_dictionary.pad()
    theirs_lp = hf_log_probs(model, right_padded(src, pad), prev, pad)
    return float((ours_lp - theirs_lp).abs().max())


def vocabulary(dictionary: Any) -> dict[str, int]:
    """A fairseq dictionary as token -> id."""
    return {symbol: index for index, symbol in enumerate(dictionary.symbols)}


def write_marian_tokenizer(directory: Path, pipeline: TextPipeline, task: Any) -> None:
    """``MarianTokenizer``'s files: the SentencePiece model as ``source.spm`` and
    ``target.spm`` (one joint model) and the vocabularies by fairseq id."""
    transformers = require_transformers()
    source_vocab = directory / "marian_source_vocab.json"
    target_vocab = directory / "marian_target_vocab.json"
    source_vocab.write_text(json.dumps(vocabulary(task.source_dictionary)), encoding="utf-8")
    target_vocab.write_text(json.dumps(vocabulary(task.target_dictionary)), encoding="utf-8")
    tokenizer = transformers.MarianTokenizer(
        str(pipeline.model_path), str(pipeline.model_path), str(source_vocab),
        target_vocab_file=str(target_vocab), source_lang=pipeline.source_lang,
        target_lang=pipeline.target_lang, separate_vocabs=True,
        model_max_length=1024)
    tokenizer.save_pretrained(str(directory))
    source_vocab.unlink()
    target_vocab.unlink()


#: What Moses escaping (sacremoses' ``escape=True``, which FSMTTokenizer always applies) turns
#: each character into.
MOSES_ESCAPES = {"&": "&amp;", "|": "&#124;", "<": "&lt;", ">": "&gt;", "'": "&apos;",
                 '"': "&quot;", "[": "&#91;", "]": "&#93;"}
END_OF_WORD = "</w>"


def escaped(piece: str) -> str:
    """A BPE symbol spelled as FSMTTokenizer sees it: each escapable character as its Moses
    entity (a trailing ``</w>`` kept as it is)."""
    body, end = (piece[: -len(END_OF_WORD)], END_OF_WORD) if piece.endswith(END_OF_WORD) \
        else (piece, "")
    return "".join(MOSES_ESCAPES.get(char, char) for char in body) + end


def entity_merges() -> list[tuple[str, str]]:
    """Merges that join each entity's characters into one symbol (inside a word and at its
    end), so that an escaped character is one symbol, as the raw character is in ours."""
    merges: dict[tuple[str, str], None] = {}
    for entity in MOSES_ESCAPES.values():
        for end in ("", END_OF_WORD):
            symbol = entity[0]
            for index, char in enumerate(entity[1:], start=1):
                char = char + end if index == len(entity) - 1 else char
                merges[(symbol, char)] = None
                symbol += char
    return list(merges)


def fsmt_vocabulary(dictionary: Any) -> dict[str, int]:
    """A fairseq BPE dictionary in FSMTTokenizer's spelling: a piece that continues a word
    (``ab@@``) loses its marker, a word's last piece gains ``</w>``, escapable characters become
    their Moses entities; special symbols stay."""
    out = {}
    for index, symbol in enumerate(dictionary.symbols):
        if index < dictionary.nspecial:
            out[symbol] = index
        elif symbol.endswith("@@"):
            out[escaped(symbol[:-2])] = index
        else:
            out[escaped(symbol + END_OF_WORD)] = index
    return out


def fsmt_merges(codes: Path) -> list[str]:
    """Our subword-nmt codes as FSMTTokenizer's merges: the entity merges first, then ours in
    their order with escapable characters spelled as entities."""
    lines = [line for line in codes.read_text(encoding="utf-8").split("\n")
             if line and not line.startswith("#version")]
    merges = [" ".join(pair) for pair in entity_merges()]
    for line in lines:
        parts = line.split(" ")
        if len(parts) != 2:
            raise ArtifactError(f"{codes}: not a subword-nmt merge line: {line[:40]!r}")
        merges.append(" ".join(escaped(part) for part in parts))
    return merges


def write_fsmt_tokenizer(directory: Path, pipeline: TextPipeline, task: Any) -> None:
    """``FSMTTokenizer``'s files: both vocabularies and our BPE merges in its spelling (its
    Moses step escapes; the entities are made single symbols, so an escaped ``'s`` splits as
    ours does)."""
    transformers = require_transformers()
    source_vocab, target_vocab = directory / "vocab-src.json", directory / "vocab-tgt.json"
    source_vocab.write_text(json.dumps(fsmt_vocabulary(task.source_dictionary),
                                       ensure_ascii=False), encoding="utf-8")
    target_vocab.write_text(json.dumps(fsmt_vocabulary(task.target_dictionary),
                                       ensure_ascii=False), encoding="utf-8")
    merges = directory / "merges.txt"
    merges.write_text("\n".join(fsmt_merges(pipeline.model_path)) + "\n", encoding="utf-8")
    tokenizer = transformers.FSMTTokenizer(
        langs=[pipeline.source_lang, pipeline.target_lang], src_vocab_file=str(source_vocab),
        tgt_vocab_file=str(target_vocab), merges_file=str(merges),
        do_lower_case=pipeline.lowercase, model_max_length=1024)
    tokenizer.save_pretrained(str(directory))


def export_transformers(
    checkpoint: str | os.PathLike,
    data_dir: str | os.PathLike,
    output: str | os.PathLike,
    source_lang: str | None = None,
    target_lang: str | None = None,
    bpe_codes: str | os.PathLike | None = None,
    sentencepiece_model: str | os.PathLike | None = None,
    moses: bool | None = None,
) -> ExportedDirectory:
    """Write the transformers model directory ``output`` of our ``checkpoint`` (dictionaries
    in ``data_dir``): Marian or FSMT (module docstring), its tokenizer, the text pipeline and
    :data:`MANIFEST`. Verified and moved into place whole; one-line error, nothing written."""
    from ..artifacts.model_files import checkpoint_text_pipeline

    require_transformers()
    output, data_dir = Path(output), Path(data_dir)
    refuse_foreign_output(output, "transformers")
    ours, task, _ = load_our_model(checkpoint, data_dir, source_lang, target_lang)
    theirs = to_builtin_transformer(ours, task)
    reason = transformers_refusal(theirs)
    if reason is not None:
        raise ArtifactError(f"{checkpoint}: {reason}")
    pipeline = checkpoint_text_pipeline(checkpoint, data_dir, task.cfg.source_lang,
                                        task.cfg.target_lang, bpe_codes, sentencepiece_model,
                                        moses)
    learned = bool(ours.cfg.encoder_learned_pos or ours.cfg.decoder_learned_pos)
    marian = pipeline.subword == "sentencepiece" and not learned
    model = build_hf_model(theirs, task, marian)
    difference = max_difference(ours, model, task)
    if not difference <= VERIFY_TOLERANCE:
        raise ArtifactError(f"the {type(model).__name__} log-probabilities differ from ours by "
                            f"{difference:.2e} (more than {VERIFY_TOLERANCE})")
    manifest = {
        "format": FORMAT, "source_checkpoint": Path(checkpoint).name,
        "model_class": type(model).__name__,
        "tokenizer_class": {"sentencepiece": "MarianTokenizer",
                            "bpe": "FSMTTokenizer"}.get(pipeline.subword),
        "source_lang": task.cfg.source_lang, "target_lang": task.cfg.target_lang,
        "decoding": {"num_beams": BEAM, "paper_lenpen": LENPEN,
                     "note": "transformers has no GNMT penalty and no source + 50 limit"},
    }

    def fill(directory: Path) -> None:
        model.save_pretrained(str(directory))
        pipeline.ship(directory)
        for name, dictionary in ((SOURCE_VOCAB, task.source_dictionary),
                                 (TARGET_VOCAB, task.target_dictionary)):
            (directory / name).write_text(json.dumps(vocabulary(dictionary),
                                                     ensure_ascii=False), encoding="utf-8")
        if manifest["tokenizer_class"] == "MarianTokenizer":
            write_marian_tokenizer(directory, pipeline, task)
        elif manifest["tokenizer_class"] == "FSMTTokenizer":
            write_fsmt_tokenizer(directory, pipeline, task)
        reloaded = type(model).from_pretrained(str(directory)).eval()
        difference = max_difference(ours, reloaded, task)
        if not difference <= VERIFY_TOLERANCE:
            raise ArtifactError(f"after from_pretrained, the log-probabilities differ from "
                                f"ours by {difference:.2e} (more than {VERIFY_TOLERANCE})")
        manifest["verified_max_logprob_difference"] = difference

    write_export(output, "transformers", manifest, fill, check_transformers_export)
    return ExportedDirectory(
        output, manifest,
        f"{manifest['model_class']} + {manifest['tokenizer_class']}, {manifest['source_lang']}->"
        f"{manifest['target_lang']}; load with AutoModelForSeq2SeqLM.from_pretrained("
        f"{str(output)!r})")
