"""The trainer's --config file and flags fed what users really have: text in other encodings,
binary garbage, numeric extremes. Every input either parses or is one ConfigError line (the CLI
prints it and exits 2); nothing else escapes."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainer.common.errors import ConfigError
from trainer.settings.flags import parse
from trainer.settings.train_config import FIELD_NAMES

ODD_YAML = st.sampled_from(
    ["a: 2026-02-30\n", "epochs: 2026-13-01\n", "[" * 5000, "- " * 3000 + "x\n", "!!binary x\n"]
)
NUMERIC_EXTREMES = st.sampled_from(
    [".nan", ".inf", "-.inf", "1e999", "-1e999", "1" + "0" * 400, "-" + "9" * 400, "0x10", "1_000"]
)
# tmp_path is shared by a test's examples: each example overwrites the one file it uses.
FILE_EXAMPLES = settings(
    max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
ENCODINGS = st.sampled_from(["latin-1", "cp1252", "utf-16", "utf-16-le", "utf-32", "utf-8-sig"])


def parses_or_one_line(path, tmp_argv=()) -> None:
    try:
        parse(["--config", str(path), *tmp_argv])
    except ConfigError as err:
        assert "\n" not in str(err) and len(str(err)) < 1000


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(FIELD_NAMES), value=NUMERIC_EXTREMES)
def test_numeric_extremes_in_yaml_for_every_setting(tmp_path, key, value):
    path = tmp_path / "train.yaml"
    path.write_text(f"{key}: {value}\n", encoding="utf-8")
    parses_or_one_line(path)


@settings(max_examples=60)
@given(key=st.sampled_from(FIELD_NAMES), value=NUMERIC_EXTREMES)
def test_numeric_extremes_as_flags_for_every_setting(key, value):
    try:
        parse(
            ["--" + key.replace("_", "-"), value.replace(".", "", 1) if value[0] == "." else value]
        )
    except ConfigError as err:
        assert "\n" not in str(err) and len(str(err)) < 1000
    except SystemExit as exit_:  # argparse: a boolean flag given a value
        assert exit_.code == 2


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    encoding=ENCODINGS,
    comment=st.text(alphabet=st.characters(min_codepoint=0xA0, max_codepoint=0x24F), min_size=1),
)
def test_yaml_in_other_encodings(tmp_path, encoding, comment):
    path = tmp_path / "train.yaml"
    path.write_bytes(f"batch_size: 8  # {comment}\nepochs: 2\n".encode(encoding, "replace"))
    parses_or_one_line(path)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300))
def test_binary_garbage_as_the_config_file(tmp_path, data):
    path = tmp_path / "train.yaml"
    path.write_bytes(data)
    parses_or_one_line(path)


def test_a_latin1_comment_names_the_file_the_byte_and_the_fix(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_bytes("batch_size: 8  # café\n".encode("latin-1"))
    try:
        parse(["--config", str(path)])
    except ConfigError as err:
        assert str(err) == (
            f"config={path}: not UTF-8 text (byte 0xe9 at offset 20); save it as UTF-8 "
            "(for example iconv -f latin1 -t utf-8)"
        )
    else:
        raise AssertionError("a Latin-1 file must not parse as UTF-8")


@FILE_EXAMPLES
@given(document=ODD_YAML)
def test_yaml_that_parses_but_cannot_be_built(tmp_path, document):
    path = tmp_path / "train.yaml"
    path.write_text(document, encoding="utf-8")
    parses_or_one_line(path)


def test_a_manifest_that_is_not_utf8_is_one_line_for_shards_and_tokens(tmp_path):
    from trainer.data.errors import DataError
    from trainer.data.manifest import Manifest
    from trainer.data.token_shards import TokenManifest

    (tmp_path / "manifest.json").write_bytes('{"format": "café"}'.encode("latin-1"))
    for reader, what in ((Manifest, "dataset"), (TokenManifest, "text")):
        try:
            reader.load(tmp_path)
        except DataError as err:
            assert str(err) == (
                f"{tmp_path / 'manifest.json'}: cannot read it (not UTF-8 text); "
                f"prepare the {what} again"
            )
        else:
            raise AssertionError(f"{reader.__name__} read a Latin-1 manifest")
