"""One reader of conf/ group files (orchestrator/config/groups.py): parsed once while unchanged, fresh copies."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.config.groups import BadGroupFile, read_group
from orchestrator.config.places import CONF_DIR


def test_every_shipped_group_reads_as_hydra_would_see_its_fields() -> None:
    models = read_group(CONF_DIR / "model")
    assert "pythia-tiny" in models and "defaults" not in models["pythia-tiny"]
    assert models["pythia-tiny"]["name"] == "pythia-tiny"
    assert read_group(CONF_DIR / "no-such-group") == {}


def test_a_caller_changing_what_it_got_changes_nothing_for_the_next(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("name: a\nshape: {layers: 2}\nlist: [1, 2]\n")
    first = read_group(tmp_path)["a"]
    first["shape"]["layers"] = 99  # type: ignore[index]
    first["list"].append(3)  # type: ignore[union-attr]
    assert read_group(tmp_path)["a"] == {"name": "a", "shape": {"layers": 2}, "list": [1, 2]}


def test_an_edited_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text("value: 1\n")
    assert read_group(tmp_path)["a"] == {"value": 1}
    path.write_text("value: 22\n")
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert read_group(tmp_path)["a"] == {"value": 22}


def test_a_bad_file_is_named_or_left_out_where_the_reader_makes_do(tmp_path: Path) -> None:
    (tmp_path / "good.yaml").write_text("value: 1\n")
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(BadGroupFile, match=r"list\.yaml: expected a mapping of .* fields, got list"):
        read_group(tmp_path)
    (tmp_path / "list.yaml").unlink()
    (tmp_path / "broken.yaml").write_text("value: [1\n")
    with pytest.raises(BadGroupFile, match=r"broken\.yaml: not valid YAML"):
        read_group(tmp_path)
    assert read_group(tmp_path, strict=False) == {"empty": {}, "good": {"value": 1}}
