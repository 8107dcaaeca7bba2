"""graders.datasets: sources, schemas, image names and the SWE-smith patch reversal, as a library."""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest

from agentrl.graders.datasets import (
    DatasetError,
    ImportOptions,
    UnknownInstance,
    import_rows,
    read_source,
    reverse_patch,
    select_instances,
    swe_gym_image,
    swebench_image,
    swepro_image,
    swesmith_image,
    write_rows,
)

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "datasets"
VERIFIED = DATA / "swebench_verified.json"


# -- sources ---------------------------------------------------------------------------


def test_parquet_and_json_sources_read_the_same_records(tmp_path):
    """A parquet file written from the Verified fixture reads back as the same records."""
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    records = json.loads(VERIFIED.read_text())
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "verified.parquet")
    assert read_source(tmp_path / "verified.parquet") == records == read_source(VERIFIED)


def test_a_json_object_of_splits_picks_test_then_the_only_split(tmp_path):
    """An object of splits reads --split; without it, test, else the only split, else an error."""
    rows = [{"instance_id": "a"}]
    (tmp_path / "one.json").write_text(json.dumps({"train": rows}))
    assert read_source(tmp_path / "one.json") == rows
    (tmp_path / "two.json").write_text(json.dumps({"train": rows, "dev": [{"instance_id": "b"}]}))
    assert read_source(tmp_path / "two.json", split="dev") == [{"instance_id": "b"}]
    with pytest.raises(DatasetError, match="holds the splits dev, train: choose one with --split"):
        read_source(tmp_path / "two.json")
    with pytest.raises(DatasetError, match="has no split 'test'; its splits: dev, train"):
        read_source(tmp_path / "two.json", split="test")


def test_a_datasets_save_to_disk_directory_is_read_by_split(tmp_path):
    """A DatasetDict saved with save_to_disk reads its train split (SWE-Gym's only split)."""
    datasets = pytest.importorskip("datasets")
    gym = json.loads((DATA / "swe_gym.json").read_text())["train"]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(gym)}).save_to_disk(tmp_path / "gym")
    assert read_source(tmp_path / "gym") == gym


def test_a_hub_snapshot_directory_reads_its_split_parquet_shards(tmp_path):
    """data/<split>-00000-of-00001.parquet, the hub's layout, is read by split name."""
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    (tmp_path / "data").mkdir()
    pq.write_table(
        pa.Table.from_pylist([{"instance_id": "t"}]), tmp_path / "data/test-00000-of-00001.parquet"
    )
    pq.write_table(
        pa.Table.from_pylist([{"instance_id": "d"}]), tmp_path / "data/dev-00000-of-00001.parquet"
    )
    assert read_source(tmp_path) == [{"instance_id": "t"}]
    assert read_source(tmp_path, split="dev") == [{"instance_id": "d"}]


def test_unreadable_sources_are_named(tmp_path):
    """A missing file, an unknown suffix, bad JSONL and a plain directory each say what is wrong."""
    with pytest.raises(DatasetError, match="does not exist"):
        read_source(tmp_path / "nope.json")
    (tmp_path / "rows.csv").write_text("instance_id\n")
    with pytest.raises(DatasetError, match=r"expected a \.parquet, \.json or \.jsonl"):
        read_source(tmp_path / "rows.csv")
    (tmp_path / "bad.jsonl").write_text('{"instance_id": "a"}\n[1]\n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl:2: a record must be a JSON object"):
        read_source(tmp_path / "bad.jsonl")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="is not a dataset directory"):
        read_source(tmp_path / "empty")


# -- selection -------------------------------------------------------------------------


def test_instances_keep_the_source_order_and_limit_applies_after():
    """--instance keeps the dataset's order; --limit then takes the first N of those."""
    items = ["a-1", "b-2", "c-3", "d-4"]
    assert select_instances(items, str, instances=["d-4", "b-2"]) == ["b-2", "d-4"]
    assert select_instances(items, str, instances=["d-4", "b-2", "c-3"], limit=2) == ["b-2", "c-3"]
    assert select_instances(items, str, limit=0) == []


def test_an_unknown_instance_names_its_near_matches():
    """A mistyped id is an error that suggests the ids it is close to."""
    ids = ["django__django-11099", "django__django-11133", "sympy__sympy-20590"]
    with pytest.raises(UnknownInstance, match=r"'django__django-1099' \(did you mean django__"):
        select_instances(ids, str, instances=["django__django-1099"])


# -- image names -----------------------------------------------------------------------


def test_swebench_image_names_match_swebench_own_image_spec():
    """The derived names are exactly swebench's ImageSpec.name, remote and local."""
    image_spec = pytest.importorskip("swebench.image_builder.image_spec")
    for iid in ("django__django-11099", "astropy__astropy-12907"):
        for namespace in ("swebench", None):
            spec = image_spec.ImageSpec(instance_id=iid, dockerfile="FROM x", namespace=namespace)
            assert swebench_image(iid, namespace) == spec.name
    assert (
        swebench_image("django__django-11099", "none")
        == "sweb.eval.x86_64.django__django-11099:latest"
    )
    assert (
        swebench_image("django__django-11099")
        == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    )


def test_swe_gym_swesmith_and_pro_image_names():
    """SWE-Gym writes __ as _s_, SWE-smith as _1776_ with the commit, Pro uses dockerhub_tag."""
    assert (
        swe_gym_image("getmoto__moto-6510")
        == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-6510:latest"
    )
    assert (
        swesmith_image("swesmith/Instagram__MonkeyType.70c3acf6")
        == "jyangballin/swesmith.x86_64.instagram_1776_monkeytype.70c3acf6"
    )
    with pytest.raises(DatasetError, match="not a SWE-smith mirror"):
        swesmith_image("pallets/flask")
    record = {"repo": "NodeBB/NodeBB", "instance_id": "instance_NodeBB__NodeBB-04998908-vnan"}
    assert swepro_image(record) == "jefzda/sweap-images:nodebb.nodebb-NodeBB__NodeBB-04998908"
    assert swepro_image({**record, "dockerhub_tag": "tag-1"}) == "jefzda/sweap-images:tag-1"


# -- schemas ---------------------------------------------------------------------------


def test_a_missing_required_column_names_it_and_the_schema(tmp_path):
    """A record without test_patch is refused with the column and the schema expected."""
    records = json.loads(VERIFIED.read_text())
    del records[1]["test_patch"]
    (tmp_path / "v.json").write_text(json.dumps(records))
    with pytest.raises(DatasetError) as caught:
        import_rows("swebench", tmp_path / "v.json")
    message = str(caught.value)
    assert "record 2 (django__django-11099): column 'test_patch' is missing" in message
    assert "the swebench schema" in message and "FAIL_TO_PASS" in message


def test_swebench_rows_keep_the_instance_and_its_published_image():
    """The instance (tests decoded from JSON) goes to remote_env_info with its own image."""
    rows = import_rows("swebench", VERIFIED, instances=["django__django-11099"])
    (row,) = rows
    instance = row["metadata"]["remote_env_info"]
    assert instance["FAIL_TO_PASS"][0].startswith("test_ascii_validator")
    assert instance["image"] == "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    assert instance["log_parser"] == "parse_log_django" and instance["workdir"] == "/testbed"
    assert "repo" not in row["metadata"]  # metadata.repo is a host path for the graders
    local = import_rows(
        "swebench", VERIFIED, limit=1, options=ImportOptions(image_namespace="none")
    )
    assert local[0]["metadata"]["image"] == "sweb.eval.x86_64.astropy__astropy-12907:latest"


def test_swebench_pro_needs_its_run_scripts(tmp_path):
    """Without --scripts-dir, or with an instance's scripts missing, Pro rows are refused."""
    source = DATA / "swebench_pro.json"
    with pytest.raises(DatasetError, match="pass its run_scripts directory with --scripts-dir"):
        import_rows("swebench-pro", source)
    with pytest.raises(DatasetError, match=r"run_script\.sh is missing"):
        import_rows("swebench-pro", source, options=ImportOptions(scripts_dir=str(tmp_path)))


def test_swebench_pro_rows_carry_the_harness_inputs():
    """Test lists are parsed from their Python literals; only before_repo_set_cmd's last line
    runs, as in SWE-bench Pro's harness; the prompt adds requirements and interface."""
    options = ImportOptions(scripts_dir=str(DATA / "swebench_pro_run_scripts"))
    row = import_rows("swebench-pro", DATA / "swebench_pro.json", limit=1, options=options)[0]
    swepro = row["metadata"]["swepro"]
    assert swepro["fail_to_pass"] == [
        "tests/unit/utils/test_utils.py::test_format_seconds[3600-1:00:00]"
    ]
    assert swepro["selected_test_files"] == ["tests/unit/utils/test_utils.py"]
    assert swepro["before_repo_set_cmd"].startswith("git checkout f91ace96")
    assert pathlib.Path(swepro["run_script_path"]).is_file()
    assert "Requirements:\n- `format_seconds`" in row["prompt"]
    assert row["metadata"]["workdir"] == "/app"


def test_swesmith_rejects_tests_that_are_not_pytest_node_ids(tmp_path):
    """A SWE-smith record from a non-pytest repository is refused, naming the test."""
    record = json.loads((DATA / "swe_smith.jsonl").read_text().splitlines()[0])
    record["FAIL_TO_PASS"] = ["TestParseHeader"]
    (tmp_path / "go.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(
        DatasetError,
        match="column 'FAIL_TO_PASS' lists 'TestParseHeader', which is not a pytest node id",
    ):
        import_rows("swe-smith", tmp_path / "go.jsonl")


def test_write_rows_is_atomic_and_refuses_to_overwrite(tmp_path):
    """An existing file is kept unless force; a failing row iterator leaves no partial file."""
    out = tmp_path / "tasks.jsonl"
    assert write_rows([{"a": 1}], out) == 1
    with pytest.raises(DatasetError, match="exists; pass --force"):
        write_rows([{"a": 2}], out)

    def broken():
        yield {"a": 3}
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_rows(broken(), out, force=True)
    assert out.read_text() == '{"a": 1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["tasks.jsonl"]


# -- the SWE-smith gold patch ----------------------------------------------------------


def _git(repo: pathlib.Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], input=stdin, capture_output=True, text=True, check=True
    ).stdout


def test_reverse_patch_undoes_a_real_git_diff(tmp_path):
    """A diff with edits, an added, a deleted file and a missing final newline, reversed,
    brings the tree back byte for byte (git apply checks every hunk)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("".join(f"line {i}\n" for i in range(30)))
    (repo / "gone.py").write_text("old\n")
    (repo / "tail.txt").write_text("no newline")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    lines = [f"line {i}\n" for i in range(30)]
    lines[3] = "changed 3\n"
    lines[20:22] = ["new 20\n", "new 21\n", "extra\n"]
    (repo / "a.py").write_text("".join(lines))
    (repo / "gone.py").unlink()
    (repo / "new.py").write_text("fresh\n")
    (repo / "tail.txt").write_text("still no newline, changed")
    _git(repo, "add", "-A")
    patch = _git(repo, "diff", "--cached")
    reverse = reverse_patch(patch)
    _git(repo, "apply", "--check", "--cached", "-", stdin=reverse)
    _git(repo, "apply", "--cached", "-", stdin=reverse)
    assert _git(repo, "diff", "--cached", "HEAD") == ""
    assert reverse_patch(reverse) == patch


def test_swesmith_pre_commands_plant_the_bug_where_git_does_not_show_it(tmp_path):
    """After the pre_commands the bug is in the tree, git status and diff are clean, the
    history is the one commit it had, the reflog is empty and the fixed file's object is
    gone: nothing in the repository shows the change."""
    repo = tmp_path / "testbed"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "Initial commit")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    bug = _git(repo, "diff")
    _git(repo, "checkout", "--", "calc.py")
    record = {
        "instance_id": "o__calc.0123abcd.func_basic__1",
        "repo": "swesmith/o__calc.0123abcd",
        "patch": bug,
        "FAIL_TO_PASS": ["tests/test_calc.py::test_add"],
        "PASS_TO_PASS": [],
        "problem_statement": "add subtracts",
    }
    (tmp_path / "smith.jsonl").write_text(json.dumps(record) + "\n")
    (row,) = import_rows("swe-smith", tmp_path / "smith.jsonl")
    for command in row["metadata"]["pre_commands"]:
        subprocess.run(["bash", "-ec", command], cwd=repo, check=True, capture_output=True)
    assert "a - b" in (repo / "calc.py").read_text()
    assert _git(repo, "status", "--porcelain") == ""
    assert _git(repo, "log", "--format=%s") == "Initial commit\n"
    assert _git(repo, "reflog") == ""
    fixed = subprocess.run(
        ["git", "-C", str(repo), "hash-object", "--stdin"],
        input="def add(a, b):\n    return a + b\n",
        capture_output=True,
        text=True,
    ).stdout.strip()
    gone = subprocess.run(["git", "-C", str(repo), "cat-file", "-e", fixed], capture_output=True)
    assert gone.returncode != 0  # the fixed file's blob was pruned with the old commit
    assert row["metadata"]["gold_patch"] == reverse_patch(bug)


def test_a_parquet_timestamp_column_is_written_as_iso_8601(tmp_path):
    """A created_at stored as a parquet timestamp (not a string) imports and is written as
    its ISO 8601 text."""
    import datetime

    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    records = json.loads(VERIFIED.read_text())[:1]
    records[0]["created_at"] = datetime.datetime(2022, 3, 3, 15, 14, 54)
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "v.parquet")
    write_rows(import_rows("swebench", tmp_path / "v.parquet"), tmp_path / "v.jsonl")
    row = json.loads((tmp_path / "v.jsonl").read_text())
    assert row["metadata"]["remote_env_info"]["created_at"] == "2022-03-03T15:14:54"
