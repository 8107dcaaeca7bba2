"""Task rows: slime's JSONL shape, grader selection, loading and the example tasks."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from agentrl import hookimpl, plugins
from agentrl.graders.base import Grader
from agentrl.graders.scaleswe import ScaleSWEGrader
from agentrl.graders.swebench import SWEBenchGrader
from agentrl.graders.tasks import (
    TaskLoadError,
    detect_grader,
    gold_patch,
    load_tasks,
    prompt_text,
    select_grader,
)
from agentrl.plugins import NotAvailableError
from agentrl.types import Grade, Task

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "tasks"
PROTOCOL_VARS = (
    "AGENTRL_TRAIN_GRADER",
    "AGENTRL_EVAL_GRADER",
    "AGENTRL_TRAIN_PROTOCOL",
    "AGENTRL_EVAL_PROTOCOL",
    "SWE_TRAIN_PROTOCOL",
    "SWE_EVAL_PROTOCOL",
)


@pytest.fixture
def clean_env(monkeypatch):
    for name in PROTOCOL_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _write_jsonl(path: pathlib.Path, rows: list[dict]) -> pathlib.Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# -- grader selection --------------------------------------------------------------------


def test_grader_defaults_to_scaleswe(clean_env):
    """With nothing set, both training and evaluation use scaleswe."""
    assert select_grader() == "scaleswe"
    assert select_grader(evaluation=True) == "scaleswe"


def test_grader_is_read_per_call_for_train_and_eval(clean_env):
    """Environment changes after import take effect, and train/eval read their own variables."""
    clean_env.setenv("SWE_TRAIN_PROTOCOL", "swebench")
    assert select_grader() == "swebench"
    assert select_grader(evaluation=True) == "scaleswe"
    clean_env.setenv("SWE_EVAL_PROTOCOL", "swebench")
    clean_env.setenv("AGENTRL_TRAIN_PROTOCOL", "scaleswe")
    assert select_grader() == "scaleswe", "AGENTRL_* wins over slime's SWE_*"
    assert select_grader(evaluation=True) == "swebench"


def test_explicit_grader_wins_over_environment(clean_env):
    """An explicit grader argument beats every environment variable."""
    clean_env.setenv("AGENTRL_EVAL_PROTOCOL", "scaleswe")
    assert select_grader("swebench", evaluation=True) == "swebench"
    assert select_grader(env={"AGENTRL_TRAIN_PROTOCOL": "x"}) == "x"


def test_detect_grader_asks_the_graders_which_claims_the_row():
    """A SWE-bench instance without a scaleswe grading field is swebench's; a row with a
    scaleswe method (even beside a test_patch) is scaleswe's; a row nobody claims, scaleswe."""
    sweb = {"metadata": {"remote_env_info": {"test_patch": "diff"}}}
    assert SWEBenchGrader.claims(sweb) and not ScaleSWEGrader.claims(sweb)
    assert detect_grader(sweb) == "swebench"
    mixed = {"metadata": {"eval_cmd": "pytest", "remote_env_info": {"test_patch": "diff"}}}
    assert ScaleSWEGrader.claims(mixed) and not SWEBenchGrader.claims(mixed)
    assert detect_grader(mixed) == "scaleswe"
    assert detect_grader({"metadata": "nope"}) == "scaleswe"
    assert detect_grader({"metadata": {}}) == "scaleswe"


class PluginRowGrader(Grader):
    """A plugin grader for rows carrying a ``plugin_task`` key (and rows scaleswe claims)."""

    name = "plugin-rows"

    @classmethod
    def claims(cls, row):
        return "plugin_task" in row or ScaleSWEGrader.claims(row)

    def parse_task(self, row):
        return Task(instance_id=row.get("plugin_task", "x"), problem_statement="", grader=self.name)

    async def grade(self, task, diff, sandbox_factory):
        return Grade(reward=0.0, solved=False)


@pytest.fixture
def plugin_grader():
    """A registry with the built-ins plus ``PluginRowGrader`` registered through a plugin."""
    registry = plugins.PluginRegistry(load_entrypoints=False, disabled=())

    class Plugin:
        @hookimpl
        def register_graders(self, register):
            register(PluginRowGrader)

    registry.pm.register(Plugin())
    previous = plugins.reset_registry(registry)
    yield registry
    plugins.reset_registry(previous)


def test_auto_asks_plugin_graders_first(plugin_grader, tmp_path, clean_env):
    """A plugin grader's rows go to it under ``auto``; where it and a built-in both claim a
    row, the plugin wins; SWE-bench rows still go to swebench."""
    assert plugins.get_graders()[0] is PluginRowGrader
    path = _write_jsonl(
        tmp_path / "t.jsonl",
        [
            {"plugin_task": "p1"},
            {"metadata": {"instance_id": "a", "eval_cmd": "true"}},
            {"metadata": {"remote_env_info": {"instance_id": "b", "test_patch": "d"}}},
        ],
    )
    rows = load_tasks(path, grader="auto")
    assert [r.task.grader for r in rows] == ["plugin-rows", "plugin-rows", "swebench"]


def test_old_protocol_names_still_work_with_a_deprecation_warning(tmp_path, clean_env):
    """``select_protocol``, ``detect_protocol``, ``load_tasks(protocol=)``, ``Task(protocol=)``
    and ``task.protocol`` keep working and warn; a stored task with a "protocol" key loads."""
    from agentrl.graders.tasks import detect_protocol, select_protocol

    with pytest.warns(DeprecationWarning, match="select_grader"):
        assert select_protocol("swebench") == "swebench"
    with pytest.warns(DeprecationWarning, match="detect_grader"):
        assert detect_protocol({"metadata": {"remote_env_info": {"eval_script": "x"}}}) == (
            "swebench"
        )
    path = _write_jsonl(tmp_path / "t.jsonl", [{"metadata": {"instance_id": "a"}}])
    with pytest.warns(DeprecationWarning, match="grader="):
        (row,) = load_tasks(path, protocol="scaleswe")
    assert row.task.grader == "scaleswe"
    with pytest.warns(DeprecationWarning, match=r"Task\.grader"):
        task = Task(instance_id="t", problem_statement="", protocol="swebench")
    assert task.grader == "swebench"
    with pytest.warns(DeprecationWarning, match=r"Task\.grader"):
        assert task.protocol == "swebench"
    stored = {"instance_id": "t", "problem_statement": "", "protocol": "swebench"}
    assert Task.from_dict(stored) == task
    assert Task.from_dict(task.to_dict()) == task and "protocol" not in task.to_dict()


# -- scaleswe rows ---------------------------------------------------------------------


def test_prompt_text_from_string_and_chat_list():
    """The problem statement falls back to a string prompt or the first user message."""
    assert prompt_text("fix it") == "fix it"
    chat = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "line 1"}, "line 2"]},
    ]
    assert prompt_text(chat) == "line 1\nline 2"
    assert prompt_text(None) == ""


def test_scaleswe_flat_metadata():
    """Flat metadata fields map onto the Task; pre_commands keep their order."""
    task = ScaleSWEGrader().parse_task(
        {
            "prompt": "ignored",
            "label": "lbl",
            "metadata": {
                "instance_id": "inst-1",
                "image": "registry/img:1",
                "workdir": "/workspace/repo",
                "problem_statement": "the issue",
                "eval_cmd": "pytest -x tests",
                "pre_commands": ["git checkout abc -f", "pip install -e ."],
            },
        }
    )
    assert task.instance_id == "inst-1"
    assert task.image == "registry/img:1"
    assert task.workdir == "/workspace/repo"
    assert task.problem_statement == "the issue"
    assert task.grader == "scaleswe"
    assert task.pre_commands == ("git checkout abc -f", "pip install -e .")
    assert task.grading["method"] == "eval_cmd"
    assert task.metadata["label"] == "lbl"


def test_scaleswe_remote_env_info_fallbacks():
    """image_url, workdir, instance_id, pre_commands and f2p_script come from remote_env_info."""
    script = "import sys\nsys.exit(0)\n"
    task = ScaleSWEGrader().parse_task(
        {
            "prompt": [{"role": "user", "content": "from the prompt"}],
            "label": "x" * 300,
            "metadata": {
                "remote_env_info": {
                    "instance_id": "remote-id",
                    "image_url": "img:2",
                    "workdir": "/repo",
                    "pre_commands": "cd /repo\\ngit status",
                    "f2p_script": script,
                }
            },
        }
    )
    assert (task.instance_id, task.image, task.workdir) == ("remote-id", "img:2", "/repo")
    assert task.problem_statement == "from the prompt"
    assert task.pre_commands == ("cd /repo\ngit status",)
    assert task.grading["method"] == "f2p_script"
    assert task.grading["f2p_script"] == script


def test_scaleswe_method_priority():
    """swepro beats eval_cmd, which beats f2p_script."""
    grader = ScaleSWEGrader()
    metadata = {
        "instance_id": "p",
        "swepro": {"fail_to_pass": '["t::a"]', "pass_to_pass": []},
        "eval_cmd": "true",
        "remote_env_info": {"f2p_script": "pass"},
    }
    assert grader.parse_task({"metadata": metadata}).grading["method"] == "swepro"
    metadata.pop("swepro")
    assert grader.parse_task({"metadata": metadata}).grading["method"] == "eval_cmd"
    metadata.pop("eval_cmd")
    assert grader.parse_task({"metadata": metadata}).grading["method"] == "f2p_script"


def test_swepro_json_encoded_test_lists_are_decoded():
    """swepro test lists stored as JSON strings (as datasets do) become lists."""
    task = ScaleSWEGrader().parse_task(
        {"metadata": {"instance_id": "p", "swepro": {"fail_to_pass": '["a::b", "a::c"]'}}}
    )
    assert task.grading["swepro"]["fail_to_pass"] == ["a::b", "a::c"]


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"metadata": ["not", "a", "dict"]}, "metadata"),
        ({"metadata": {"instance_id": "a", "eval_cmd": 3}}, "metadata.eval_cmd"),
        ({"metadata": {"instance_id": "a", "swepro": "x"}}, "metadata.swepro"),
        ({"metadata": {"instance_id": "a", "pre_commands": 5}}, "metadata.pre_commands"),
        ({"metadata": {"eval_cmd": "true"}}, "metadata.instance_id"),
    ],
)
def test_scaleswe_bad_field_is_named(row, field):
    """A malformed row raises ValueError naming the field at fault."""
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        ScaleSWEGrader().parse_task(row)


def test_swebench_shaped_row_is_a_protocol_mismatch_for_scaleswe(tmp_path):
    """A SWE-bench row read as scaleswe is reported by check() as a protocol mismatch."""
    task = ScaleSWEGrader().parse_task(
        {
            "metadata": {
                "repo": str(tmp_path),
                "remote_env_info": {"instance_id": "django-1", "test_patch": "diff --git a/x b/x"},
            }
        }
    )
    reason = ScaleSWEGrader().check(task)
    assert reason is not None and reason.startswith("protocol mismatch")
    assert "swebench" in reason


def test_scaleswe_check_reports_missing_pieces(tmp_path):
    """check() says what is missing: a grading method, a sandbox source, swepro scripts."""
    grader = ScaleSWEGrader()
    no_method = grader.parse_task({"metadata": {"instance_id": "a", "repo": str(tmp_path)}})
    assert "no grading method" in grader.check(no_method)
    no_source = grader.parse_task({"metadata": {"instance_id": "a", "eval_cmd": "true"}})
    assert "nothing to build a sandbox from" in grader.check(no_source)
    gone = grader.parse_task(
        {"metadata": {"instance_id": "a", "eval_cmd": "true", "repo": str(tmp_path / "no")}}
    )
    assert "does not exist" in grader.check(gone)
    swepro = grader.parse_task(
        {
            "metadata": {
                "instance_id": "a",
                "repo": str(tmp_path),
                "swepro": {
                    "run_script_path": str(tmp_path / "missing.sh"),
                    "parser_script_path": str(tmp_path / "missing.py"),
                    "fail_to_pass": ["t::a"],
                },
            }
        }
    )
    assert "run_script_path" in grader.check(swepro)


# -- swebench rows ---------------------------------------------------------------------


def test_swebench_row_parsing():
    """The instance travels whole; workdir defaults to /testbed; the gold patch is `patch`."""
    task = SWEBenchGrader().parse_task(
        {
            "prompt": "fallback statement",
            "metadata": {
                "remote_env_info": {
                    "instance_id": "o__r-1",
                    "repo": "o/r",
                    "version": "1.0",
                    "image": "sweb.eval.x86_64.o_1776_r-1",
                    "patch": "diff --git a/f b/f\n",
                    "FAIL_TO_PASS": '["t::a"]',
                    "custom_field": 7,
                }
            },
        }
    )
    assert task.grader == "swebench"
    assert task.workdir == "/testbed"
    assert task.image == "sweb.eval.x86_64.o_1776_r-1"
    assert task.problem_statement == "fallback statement"
    assert task.grading["instance"]["custom_field"] == 7
    assert task.grading["instance"]["PASS_TO_PASS"] == []
    assert gold_patch(task) == "diff --git a/f b/f\n"


def test_swebench_row_without_instance_is_rejected():
    """A swebench row without remote_env_info says where the instance belongs."""
    with pytest.raises(ValueError, match="remote_env_info"):
        SWEBenchGrader().parse_task({"metadata": {"eval_cmd": "true"}})


@pytest.mark.parametrize(
    ("metadata", "field"),
    [
        ({"remote_env_info": {"instance_id": "a", "image": 5}}, "metadata.remote_env_info.image"),
        (
            {"remote_env_info": {"instance_id": "a", "workdir": []}},
            "metadata.remote_env_info.workdir",
        ),
        ({"remote_env_info": {"instance_id": "a"}, "repo": 1}, "metadata.repo"),
    ],
)
def test_swebench_bad_field_is_named(metadata, field):
    """A swebench row whose image, workdir or repo is not a string names the field at fault."""
    with pytest.raises(ValueError, match=field.replace(".", r"\.") + " must be a string"):
        SWEBenchGrader().parse_task({"metadata": metadata})


# -- loading ---------------------------------------------------------------------------


def test_load_tasks_resolves_paths_against_the_jsonl_directory(tmp_path, clean_env):
    """Relative repo, gold patch and swepro script paths resolve against the JSONL file."""
    data = tmp_path / "data"
    (data / "repo").mkdir(parents=True)
    (data / "fix.diff").write_text("diff --git a/a b/a\n")
    path = _write_jsonl(
        data / "tasks.jsonl",
        [
            {
                "prompt": "p",
                "metadata": {
                    "instance_id": "a",
                    "repo": "repo",
                    "gold_patch_path": "fix.diff",
                    "swepro": {"run_script_path": "run.sh", "parser_script_path": "/abs/p.py"},
                },
            }
        ],
    )
    (row,) = load_tasks(path)
    assert row.line == 1 and row.source == str(path)
    assert row.task.repo == str(data / "repo")
    assert gold_patch(row.task) == "diff --git a/a b/a\n"
    assert row.task.grading["swepro"]["run_script_path"] == str(data / "run.sh")
    assert row.task.grading["swepro"]["parser_script_path"] == "/abs/p.py"


def test_load_tasks_reports_file_and_line(tmp_path, clean_env):
    """A bad line is reported with its file and line number."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"metadata": {"instance_id": "a", "eval_cmd": "true"}}\n\n{oops\n')
    with pytest.raises(TaskLoadError, match=r"t\.jsonl:3:2: not valid JSON"):
        load_tasks(path)
    path.write_text('{"metadata": {"eval_cmd": 1, "instance_id": "a"}}\n')
    with pytest.raises(TaskLoadError, match=r"t\.jsonl:1: metadata\.eval_cmd"):
        load_tasks(path)


@pytest.mark.parametrize(
    ("second_line", "where"),
    [
        # cut short: the error is just past the line's last character
        ('{"metadata": {"instance_id": "b", "eval_cmd": "true"},', lambda line: len(line) + 1),
        # text after the object (indented)
        ('   {"metadata": {"instance_id": "b"}} x', lambda line: line.index(" x") + 2),
        # a trailing comma after a non-ASCII value: columns count characters, not bytes
        (
            '{"metadata": {"instance_id": "b", "eval_cmd": "tr\u00e9s €", }}',
            lambda line: line.index(", }") + 3,
        ),
    ],
)
def test_a_malformed_line_is_reported_at_its_real_line_and_column(
    tmp_path, clean_env, second_line, where
):
    """A JSON error is reported as FILE:LINE:COLUMN, the column where the error is in that
    line (a line cut short at its end is reported there, not at column 1 of the next)."""
    column = where(second_line)
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"metadata": {"instance_id": "a", "eval_cmd": "true"}}\n' + second_line + "\n",
        encoding="utf-8",
    )
    with pytest.raises(TaskLoadError) as caught:
        load_tasks(path, grader="scaleswe")
    assert f"t.jsonl:2:{column}: not valid JSON" in str(caught.value)
    try:
        json.loads(second_line)
    except json.JSONDecodeError as exc:  # the standard library agrees on the position
        assert exc.pos + 1 == column


def test_a_byte_order_mark_opening_the_file_is_not_an_error(tmp_path, clean_env):
    """A task file saved with a UTF-8 byte-order mark (as some editors do) loads."""
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"metadata": {"instance_id": "a", "eval_cmd": "true"}}\n')
    assert [row.task.instance_id for row in load_tasks(path, grader="scaleswe")] == ["a"]


@pytest.mark.parametrize("content", ["", "\n\n   \n"])
def test_an_empty_task_file_is_an_error(tmp_path, clean_env, content):
    """A file with no row is refused naming the file, not loaded as zero tasks."""
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(TaskLoadError, match=r"no tasks in .*empty\.jsonl"):
        load_tasks(path, grader="scaleswe")


def test_duplicate_instance_ids_are_refused_with_their_lines(tmp_path, clean_env):
    """Two rows of one instance id (in one file, or across the files of one run) are refused
    naming the id and every line it is on."""
    from agentrl.graders.tasks import load_task_files

    row = '{{"metadata": {{"instance_id": "{}", "eval_cmd": "true"}}}}\n'
    path = tmp_path / "t.jsonl"
    path.write_text(row.format("a") + row.format("b") + row.format("a") + row.format("a"))
    with pytest.raises(TaskLoadError) as caught:
        load_tasks(path, grader="scaleswe")
    message = str(caught.value)
    assert f"'a' at {path}:1, {path}:3, {path}:4" in message and "'b'" not in message
    other = tmp_path / "u.jsonl"
    path.write_text(row.format("a") + row.format("b"))
    other.write_text(row.format("c") + row.format("b"))
    assert len(load_tasks(other, grader="scaleswe")) == 2
    with pytest.raises(TaskLoadError, match=rf"'b' at {path}:2, {other}:2"):
        load_task_files([path, other], grader="scaleswe")


def test_load_tasks_unknown_grader_lists_choices(tmp_path, clean_env):
    """An unknown grader name fails with the registered grader names."""
    path = _write_jsonl(tmp_path / "t.jsonl", [{"metadata": {"instance_id": "a"}}])
    with pytest.raises(NotAvailableError, match=r"scaleswe.*swebench"):
        load_tasks(path, grader="nope")


def test_load_tasks_auto_picks_a_grader_per_row(tmp_path, clean_env):
    """Grader `auto` parses each row with the grader that claims it."""
    path = _write_jsonl(
        tmp_path / "t.jsonl",
        [
            {"metadata": {"instance_id": "a", "eval_cmd": "true"}},
            {"metadata": {"remote_env_info": {"instance_id": "b", "test_patch": "d"}}},
        ],
    )
    rows = load_tasks(path, grader="auto")
    assert [r.task.grader for r in rows] == ["scaleswe", "swebench"]


# -- the example tasks -----------------------------------------------------------------


def test_example_rows_match_their_sources():
    """The committed JSONL files are exactly what build_rows.py generates."""
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "build_rows.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_example_tasks_are_gradable_with_gold_patches(clean_env):
    """Every example task parses, passes check(), has a gold patch outside its repository."""
    rows = load_tasks(EXAMPLES / "scaleswe.jsonl") + load_tasks(
        EXAMPLES / "swebench.jsonl", grader="swebench"
    )
    assert len(rows) >= 4
    methods = set()
    for row in rows:
        task = row.task
        grader = ScaleSWEGrader() if task.grader == "scaleswe" else SWEBenchGrader()
        assert grader.check(task) is None, task.instance_id
        assert pathlib.Path(task.repo).is_dir()
        gold = gold_patch(task)
        assert gold and gold.startswith("diff --git")
        path = task.metadata.get("gold_patch_path")
        if path:
            assert not pathlib.Path(path).resolve().is_relative_to(pathlib.Path(task.repo))
        assert task.problem_statement.startswith("# ")
        methods.add(task.grading.get("method") or task.grader)
    assert methods == {"eval_cmd", "f2p_script", "swepro", "swebench"}


def test_example_bugs_fail_their_tests_before_the_fix(tmp_path):
    """Each scaleswe example repository's own tests fail on the unfixed code."""
    for name, tests in (("textstats", "tests/test_core.py"), ("slugkit", "tests")):
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", tests],
            cwd=EXAMPLES / "repos" / name,
            capture_output=True,
            text=True,
            timeout=120,
            env={"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"},
        )
        assert result.returncode == 1, (name, result.stdout[-500:])
        assert " failed" in result.stdout
