"""The model package and the one reader (user_plugin/artifacts/package.py, model_files.py): a
trained model travels as one self-describing folder that every door opens with no other
option, and anything else is opened only when it is unambiguous, refused in one line otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import forked_cli
import pytest
from cli import REFUSE_OUR_PLUGIN, REPO, USER_DIR, command, fairseq_env
from prepared_model import TINY_ARGS

from user_plugin.artifacts.errors import ArtifactError
from user_plugin.artifacts.package import FORMAT, MANIFEST
from user_plugin.hub import load_translator

SENTENCES = ["A man in a blue shirt is riding a bike.", "Two dogs play in the snow.",
             "A well-known woman sings \"loudly\" on a stage."]


def run(module: str, *args, stdin: str = "", **env) -> subprocess.CompletedProcess:
    return forked_cli.run([*command(module), *map(str, args)], input=stdin, text=True,
                          capture_output=True, env={**fairseq_env(), **env}, timeout=600,
                          check=False)


@pytest.fixture(scope="module")
def trained(packaged_tiny_model):
    """The tiny model of :func:`conftest.packaged_tiny_model` and its package."""
    return packaged_tiny_model


RAW = "\n".join(SENTENCES) + "\n"


def translate(*args) -> subprocess.CompletedProcess:
    return run("translate", *args, stdin=RAW)


def one_line_error(proc: subprocess.CompletedProcess, prog: str) -> str:
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), proc.stderr
    return lines[0]


def test_the_package_holds_fairseqs_released_layout_and_describes_itself(trained):
    package = trained.package
    names = sorted(os.listdir(package))
    assert names == sorted(["model.pt", "dict.en.txt", "dict.de.txt", "bpecodes",
                            "text_pipeline.json", MANIFEST, "README.md"])
    manifest = json.loads((package / MANIFEST).read_text(encoding="utf-8"))
    assert manifest["format"] == FORMAT and manifest["models"] == ["model.pt"]
    assert (manifest["source_lang"], manifest["target_lang"]) == ("en", "de")
    assert manifest["architecture"]["encoder_embed_dim"] == 32
    arch = TINY_ARGS[TINY_ARGS.index("--arch") + 1]
    assert manifest["architecture"]["arch"] == arch
    assert manifest["training_fingerprint"]["source_dictionary"]
    origin = manifest["origin"]["checkpoints"][0]
    assert origin["checkpoint"] == "checkpoint_last.pt" and origin["num_updates"] == 4
    assert set(manifest["files"]) == set(names) - {MANIFEST}
    state = __import__("torch").load(package / "model.pt", map_location="cpu", weights_only=True)
    assert "last_optimizer_state" not in state  # a released model holds no optimizer state
    card = (package / "README.md").read_text(encoding="utf-8")
    assert "en -> de" in card and "vaswani-translate PACKAGE" in card
    assert f"architecture: `{arch}`" in card
    proc = run("package", "--check", package)
    assert proc.returncode == 0 and "intact model package" in proc.stdout, proc.stderr
    assert f"en->de {arch}," in proc.stdout


def test_every_door_takes_the_package_alone_with_todays_outputs(trained, tmp_path):
    today = translate(trained.model_dir, "--data-dir", trained.data_bin)
    assert today.returncode == 0, today.stderr
    packaged = translate(trained.package)
    assert packaged.returncode == 0, packaged.stderr
    assert packaged.stdout == today.stdout and packaged.stdout.count("\n") == len(SENTENCES)
    assert "@@" not in packaged.stdout
    exported = run("export", trained.package, "--to", "ctranslate2", "--output", tmp_path / "ct2")
    assert exported.returncode == 0, exported.stderr
    from serving import start_server

    server = start_server(trained.package)
    try:
        answer = server.request("POST", "/translate", {"text": SENTENCES})
    finally:
        server.stop()
    assert answer.status == 200, answer.body
    assert "\n".join(json.loads(answer.body)["translations"]) + "\n" == today.stdout


@pytest.mark.parametrize("damage", ["replaced", "truncated", "edited", "extra", "missing"])
def test_a_damaged_package_is_refused_naming_the_file(trained, tmp_path, damage):
    package = tmp_path / "copy"
    shutil.copytree(trained.package, package)
    target = {"replaced": "dict.de.txt", "truncated": "model.pt", "edited": "text_pipeline.json",
              "extra": "checkpoint_best.pt", "missing": "bpecodes"}[damage]
    path = package / target
    if damage == "replaced":  # the same tokens in another order: shapes cannot tell
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        path.write_text("".join(lines[1::-1] + lines[2:]), encoding="utf-8")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:-100])
    elif damage == "edited":
        path.write_text(path.read_text(encoding="utf-8").replace("true", "false", 1),
                        encoding="utf-8")
    elif damage == "extra":
        shutil.copyfile(package / "model.pt", path)
    else:
        path.unlink()
    with pytest.raises(ArtifactError, match=target):
        load_translator(package)
    line = one_line_error(translate(package), "vaswani-translate")
    assert str(path) in line


def test_options_that_would_name_other_files_are_refused_for_a_package(trained):
    line = one_line_error(translate(trained.package, "--data-dir", trained.data_bin),
                          "vaswani-translate")
    assert "is a model package" in line and "--data-dir" in line
    line = one_line_error(translate(trained.package, "--source-lang", "de"), "vaswani-translate")
    assert "en->de" in line


def test_a_folder_with_two_checkpoints_is_refused_with_their_names(trained, tmp_path):
    """The README's old flow: the average written beside checkpoint_best.pt, then the folder
    given; it was translated with checkpoint_best.pt without a word."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for name in ("checkpoint_best.pt", "checkpoint_avg.pt"):
        shutil.copyfile(trained.checkpoint, folder / name)
    line = one_line_error(translate(folder, "--data-dir", trained.data_bin), "vaswani-translate")
    assert "checkpoint_avg.pt, checkpoint_best.pt" in line and "--checkpoints" in line
    picked = translate(folder, "--data-dir", trained.data_bin, "--checkpoints",
                       "checkpoint_avg.pt", "--bpe-codes", trained.model_dir / "bpe.codes")
    assert picked.returncode == 0, picked.stderr


def test_a_checkpoint_file_is_a_model_with_its_data_dir(trained):
    proc = translate(trained.checkpoint, "--data-dir", trained.data_bin)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == translate(trained.package).stdout


def test_bpe_dictionaries_without_their_codes_are_refused(trained, tmp_path):
    """Before: translated without BPE, '@@' pieces in the output, one misleading warning."""
    folder = tmp_path / "bare"
    folder.mkdir()
    shutil.copyfile(trained.checkpoint, folder / "checkpoint_last.pt")
    line = one_line_error(translate(folder, "--data-dir", trained.data_bin), "vaswani-translate")
    assert "BPE pieces" in line and "--bpe-codes" in line


def test_codes_of_another_run_are_refused_at_every_door(trained, tmp_path):
    folder = tmp_path / "foreign codes"
    folder.mkdir()
    shutil.copyfile(trained.checkpoint, folder / "checkpoint_last.pt")
    (folder / "bpecodes").write_text("#version: 0.2\nq z\nx q</w>\nz x\n", encoding="utf-8")
    line = one_line_error(translate(folder, "--data-dir", trained.data_bin), "vaswani-translate")
    assert "bpecodes" in line and "not the codes of this model" in line
    line = one_line_error(run("package", folder / "checkpoint_last.pt", "--data-dir",
                              trained.data_bin, "--output", tmp_path / "pkg"), "vaswani-package")
    assert "not the codes of this model" in line and not (tmp_path / "pkg").exists()


def test_a_package_never_replaces_a_foreign_folder_or_lies_in_its_input(trained, tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me", encoding="utf-8")
    line = one_line_error(run("package", trained.checkpoint, "--data-dir", trained.data_bin,
                              "--output", foreign), "vaswani-package")
    assert "mine" in line and (foreign / "notes.txt").read_text(encoding="utf-8") == "keep me"
    inside = trained.data_bin / "pkg"
    one_line_error(run("package", trained.checkpoint, "--data-dir", trained.data_bin,
                       "--output", inside), "vaswani-package")
    assert not inside.exists()


def test_rewriting_a_package_of_the_same_checkpoint_changes_no_byte(trained, tmp_path):
    again = tmp_path / "again"
    proc = run("package", trained.checkpoint, "--data-dir", trained.data_bin, "--output", again)
    assert proc.returncode == 0, proc.stderr
    for name in os.listdir(trained.package):
        assert (again / name).read_bytes() == (trained.package / name).read_bytes(), name


STOCK_FROM_PRETRAINED = REFUSE_OUR_PLUGIN + """
from fairseq.models.transformer import TransformerModel

exported, package = sys.argv[1], sys.argv[2]
model = TransformerModel.from_pretrained(
    exported, checkpoint_file="model.pt", data_name_or_path=package, bpe="subword_nmt",
    bpe_codes=package + "/bpecodes", tokenizer="moses", source_lang="en", target_lang="de")
print(type(model.models[0]).__name__)
print(model.translate("Two dogs play in the snow.", beam=4))
"""


@pytest.fixture(scope="module")
def exported_to_fairseq(trained, tmp_path_factory):
    out = tmp_path_factory.mktemp("exported ü")
    proc = run("export", trained.package, "--to", "fairseq", "--output", out / "model.pt")
    assert proc.returncode == 0, proc.stderr
    return out / "model.pt"


def test_stock_from_pretrained_loads_a_package_exported_to_fairseq(trained, exported_to_fairseq):
    env = {**fairseq_env(), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    env.pop("PYTHONPATH", None)
    proc = forked_cli.run([sys.executable, "-c", STOCK_FROM_PRETRAINED,
                           str(exported_to_fairseq.parent), str(trained.package)],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    name, translation = proc.stdout.strip().split("\n")[-2:]
    assert name == "TransformerModel" and translation.strip()


def test_ctranslate2s_own_converter_converts_the_fairseq_export(trained, exported_to_fairseq,
                                                               tmp_path):
    converter = shutil.which("ct2-fairseq-converter") or str(
        REPO / ".venv" / "bin" / "ct2-fairseq-converter")
    if not os.path.exists(converter):
        pytest.skip("ct2-fairseq-converter is not installed (pip install ctranslate2)")
    for flags in (["--user_dir", USER_DIR], ["--unsafe_deserialization"]):
        output = tmp_path / flags[0].strip("-")
        proc = forked_cli.run(
            [converter, "--model_path", str(exported_to_fairseq), "--data_dir",
             str(trained.package), "--output_dir", str(output), *flags],
            env=fairseq_env(), capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        import ctranslate2

        translator = ctranslate2.Translator(str(output), device="cpu")
        result = translator.translate_batch([["Two", "dogs", "play", "."]], beam_size=4)
        assert result[0].hypotheses[0]


def test_opening_a_package_reads_and_checks_each_checkpoint_once(trained, monkeypatch):
    """The checkpoint was read and CRC-checked about four times when a server started: by two
    searches of the model's files, the hub's loader and fairseq's (patched) loader."""
    import torch

    from user_plugin.artifacts import checkpoints, manifest

    model = trained.package / "model.pt"
    counts = {"sha256": 0, "crc": 0, "torch.load": 0}

    def counting(name, function):
        def count(path, *args, **kwargs):
            counts[name] += os.fspath(path) == os.fspath(model)
            return function(path, *args, **kwargs)
        return count

    monkeypatch.setattr(manifest, "sha256_of", counting("sha256", manifest.sha256_of))
    monkeypatch.setattr(checkpoints, "checkpoint_integrity_problem",
                        counting("crc", checkpoints.checkpoint_integrity_problem))
    monkeypatch.setattr(torch, "load", counting("torch.load", torch.load))
    translator = load_translator(trained.package)
    # the sha256 is the identity; the CRC-32s refuse weights changed under a rewritten manifest
    assert counts == {"sha256": 1, "crc": 1, "torch.load": 1}
    assert translator.model_files.checkpoint_sha256()  # from the checked manifest
    assert counts["sha256"] == 1


def rehash(package, *names) -> None:
    """Record the files ``names`` of ``package`` in its manifest as they now are: a manifest
    rewritten to match edited files, which the sha256 check alone cannot refuse."""
    import hashlib

    path = package / MANIFEST
    manifest = json.loads(path.read_text(encoding="utf-8"))
    for name in names:
        data = (package / name).read_bytes()
        manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    path.write_text(json.dumps(manifest), encoding="utf-8")


def edit_manifest(package, edit) -> None:
    path = package / MANIFEST
    manifest = json.loads(path.read_text(encoding="utf-8"))
    edit(manifest)
    path.write_text(json.dumps(manifest), encoding="utf-8")


def flip_a_weight_byte(checkpoint) -> None:
    """Change one byte inside the largest tensor record of a ``torch.save`` zip: torch still
    loads it (it reads no CRC), with one weight changed."""
    import struct
    import zipfile

    with zipfile.ZipFile(checkpoint) as archive:
        record = max(archive.infolist(), key=lambda info: info.file_size)
    with open(checkpoint, "r+b") as handle:
        handle.seek(record.header_offset + 26)
        name_length, extra_length = struct.unpack("<HH", handle.read(4))
        at = record.header_offset + 30 + name_length + extra_length + record.file_size // 2
        handle.seek(at)
        byte = handle.read(1)
        handle.seek(at)
        handle.write(bytes([byte[0] ^ 0x40]))


def set_pair(record_or_manifest) -> None:
    record_or_manifest["source_lang"], record_or_manifest["target_lang"] = "de", "en"


@pytest.mark.parametrize("case, expected", [
    ("the pair in the manifest",
     "says de->en, but the text_pipeline.json beside it is for en->de: the manifest was edited"),
    ("the pair in the manifest and the pipeline record",
     "says de->en, but model.pt was packaged for en->de: the manifest was edited"),
    ("the architecture", "its architecture differs from model.pt's in encoder_layers"),
    ("one model listed twice", "corrupt manifest ('models' of a package of 2 model(s) are "
                               "model1.pt, model2.pt, not model.pt, model.pt)"),
    ("a size written as text", "corrupt manifest (entry 'model.pt')"),
    ("the files as a list", "corrupt manifest ('files' must map each file"),
    ("a weight changed and the manifest rewritten", "fails its CRC-32 check"),
    ("a dictionary reordered and the manifest rewritten", "the de dictionary differs"),
])
def test_a_manifest_that_disagrees_with_its_files_is_refused_by_check_and_every_reader(
        trained, tmp_path, case, expected):
    """Every such package would otherwise pass its sha256 checks and decode wrongly: an edited
    pair with the other language's rules, a changed weight silently."""
    package = tmp_path / "edited ü"
    shutil.copytree(trained.package, package)
    if case == "the pair in the manifest":
        edit_manifest(package, set_pair)
    elif case == "the pair in the manifest and the pipeline record":
        record = package / "text_pipeline.json"
        edited = json.loads(record.read_text(encoding="utf-8"))
        set_pair(edited)
        record.write_text(json.dumps(edited), encoding="utf-8")
        rehash(package, "text_pipeline.json")
        edit_manifest(package, set_pair)
    elif case == "the architecture":
        edit_manifest(package, lambda m: m["architecture"].update(
            encoder_layers=m["architecture"]["encoder_layers"] + 1))
    elif case == "one model listed twice":
        edit_manifest(package, lambda m: m.update(models=["model.pt", "model.pt"]))
    elif case == "a size written as text":
        edit_manifest(package, lambda m: m["files"]["model.pt"].update(
            bytes=str(m["files"]["model.pt"]["bytes"])))
    elif case == "the files as a list":
        edit_manifest(package, lambda m: m.update(files=list(m["files"])))
    elif case == "a weight changed and the manifest rewritten":
        flip_a_weight_byte(package / "model.pt")
        rehash(package, "model.pt")
    else:
        path = package / "dict.de.txt"
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        path.write_text("".join(lines[1::-1] + lines[2:]), encoding="utf-8")
        rehash(package, "dict.de.txt")
    line = one_line_error(run("package", "--check", package), "vaswani-package")
    assert expected in line
    with pytest.raises(ArtifactError) as refused:
        load_translator(package)
    assert expected in str(refused.value)


def test_codes_of_fewer_or_more_merges_of_the_same_text_are_refused(trained, tmp_path):
    """Codes learnt on the same text with other merge counts share most merges with the
    model's: half as many merges leave the model's subwords unmade (most of the codes'
    subwords are in its dictionary), three times as many make subwords it never saw."""
    from subword_nmt.learn_bpe import learn_bpe

    prepared = trained.root / "work" / "prepared"
    text = tmp_path / "tokenized.txt"
    with open(text, "w", encoding="utf-8") as out:
        for lang in ("en", "de"):
            for line in (prepared / f"train.{lang}").read_text(encoding="utf-8").splitlines():
                out.write(line.replace("@@ ", "") + "\n")
    for merges, expected in ((150, "are made by none of its merges"),
                             (900, "subwords its merges make are in the dictionaries")):
        folder = tmp_path / f"codes of {merges} merges"
        folder.mkdir()
        shutil.copyfile(trained.checkpoint, folder / "checkpoint_last.pt")
        with open(text, encoding="utf-8") as infile, \
                open(folder / "bpecodes", "w", encoding="utf-8") as outfile:
            learn_bpe(infile, outfile, merges)
        line = one_line_error(translate(folder, "--data-dir", trained.data_bin),
                              "vaswani-translate")
        assert expected in line and "not the codes of this model" in line, line
    same = tmp_path / "the same codes"
    same.mkdir()
    shutil.copyfile(trained.checkpoint, same / "checkpoint_last.pt")
    shutil.copyfile(trained.package / "bpecodes", same / "bpecodes")
    assert translate(same, "--data-dir", trained.data_bin).returncode == 0


def test_a_ctranslate2_export_is_named_and_its_manifest_checked_against_its_record(trained,
                                                                                   tmp_path):
    output = tmp_path / "ct2 ü"
    exported = run("export", trained.package, "--to", "ctranslate2", "--output", output)
    assert exported.returncode == 0, exported.stderr
    line = one_line_error(translate(output), "vaswani-translate")
    assert line.endswith(f"{output} is a CTranslate2 export: translate it with --backend "
                         "ctranslate2 (the hub's backend=\"ctranslate2\")")
    assert translate(output, "--backend", "ctranslate2").returncode == 0
    path = output / "vaswani_export.json"
    manifest = json.loads(path.read_text(encoding="utf-8"))
    set_pair(manifest)
    path.write_text(json.dumps(manifest), encoding="utf-8")
    line = one_line_error(translate(output, "--backend", "ctranslate2"), "vaswani-translate")
    assert line.endswith(f"{path}: says de->en, but the text_pipeline.json beside it is for "
                         "en->de: the manifest was edited")
