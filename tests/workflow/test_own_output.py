"""check_own_output: the one rule by which merge, tune, similarity and push's staging replace a folder."""

import pytest

from hf_dpmerge.utils.own_output import check_own_output

OPTIONS = {"marker": "ours.json", "output": "similarity output", "flag": "--output_dir"}


def test_a_missing_or_empty_folder_is_free(tmp_path):
    check_own_output(tmp_path / "missing", overwrite=False, **OPTIONS)
    (tmp_path / "empty").mkdir()
    check_own_output(tmp_path / "empty", overwrite=False, **OPTIONS)


def test_a_file_is_refused_naming_the_flag(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(FileExistsError, match="--output_dir .* is not a directory: choose another --output_dir"):
        check_own_output(tmp_path / "file", overwrite=True, **OPTIONS)


def test_a_previous_output_is_replaced_only_on_request(tmp_path):
    (tmp_path / "ours.json").write_text("{}")
    with pytest.raises(FileExistsError, match="pass --overwrite to replace a previous similarity output"):
        check_own_output(tmp_path, overwrite=False, **OPTIONS)
    check_own_output(tmp_path, overwrite=True, **OPTIONS)


def test_a_folder_without_the_marker_is_never_ours_to_replace(tmp_path):
    (tmp_path / "thesis.tex").write_text("years of work")
    with pytest.raises(FileExistsError, match="holds no previous similarity output \\(no ours.json\\)"):
        check_own_output(tmp_path, overwrite=True, **OPTIONS)
    assert (tmp_path / "thesis.tex").read_text() == "years of work"
