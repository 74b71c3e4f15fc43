"""Reading configurations: include, environment and --set overrides, file problems."""

import pytest

from datarax.config.loader import load, merge_tables, parse_key_path, parse_value
from datarax.config.schema import ConfigError

TOP = ("batch_size", "seed", "source", "stages", "trainer")


def write(path, text):
    path.write_text(text)
    return path


def test_merge_tables_merges_tables_and_replaces_everything_else():
    base = {"a": {"x": 1, "y": 2}, "list": [1, 2], "s": 1}
    over = {"a": {"y": 3}, "list": [9], "t": 2}
    assert merge_tables(base, over) == {"a": {"x": 1, "y": 3}, "list": [9], "s": 1, "t": 2}
    assert base == {"a": {"x": 1, "y": 2}, "list": [1, 2], "s": 1}


def test_includes_merge_in_order_under_the_including_file(tmp_path):
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub" / "base.toml", 'batch_size = 8\nseed = 1\n[source.memory]\nshuffle = true\n')
    write(tmp_path / "sub" / "more.toml", 'include = "base.toml"\nseed = 2\n')
    main = write(tmp_path / "main.toml", 'include = ["sub/more.toml"]\nbatch_size = 16\n[source.memory]\nseed = 5\n')
    loaded = load(main, top_level=TOP, environ={})
    assert loaded.raw == {"batch_size": 16, "seed": 2, "source": {"memory": {"shuffle": True, "seed": 5}}}
    assert [p.rsplit("/", 1)[-1] for p in loaded.files] == ["main.toml", "more.toml", "base.toml"]


def test_include_cycles_and_missing_includes_are_reported(tmp_path):
    write(tmp_path / "a.toml", 'include = "b.toml"\n')
    write(tmp_path / "b.toml", 'include = "a.toml"\n')
    with pytest.raises(ConfigError, match=r"include forms an include cycle \(a\.toml -> b\.toml -> a\.toml\)"):
        load(tmp_path / "a.toml", top_level=TOP, environ={})
    write(tmp_path / "c.toml", 'include = ["a.toml", "nope.toml"]\n')
    with pytest.raises(ConfigError, match=r"include\[1\] names '.*nope\.toml', which does not exist"):
        load(tmp_path / "c.toml", top_level=TOP, environ={})


def test_a_missing_file_and_bad_toml_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"config file '.*absent\.toml' does not exist; check the path"):
        load(tmp_path / "absent.toml", top_level=TOP, environ={})
    bad = write(tmp_path / "bad.toml", "batch_size = = 3\n")
    with pytest.raises(ConfigError, match=r"is not valid TOML: .*line 1"):
        load(bad, top_level=TOP, environ={})


@pytest.mark.parametrize("text,value", [
    ("64", 64), ("0.5", 0.5), ("true", True), ("[1, 2]", [1, 2]), ('"quoted"', "quoted"),
    ("mymod:make_data", "mymod:make_data"), ("{ a = 1 }", {"a": 1}),
])
def test_override_values_are_read_as_toml_or_plain_text(text, value):
    assert parse_value(text) == value


@pytest.mark.parametrize("text,path", [
    ("batch_size", ["batch_size"]),
    ("stages[1].brightness.max_delta", ["stages", 1, "brightness", "max_delta"]),
    ("stages.1.brightness", ["stages", 1, "brightness"]),
    ("a[0][2].b", ["a", 0, 2, "b"]),
])
def test_parse_key_path(text, path):
    assert parse_key_path(text) == path


def test_environment_overrides_reach_nested_keys_and_array_items(tmp_path):
    main = write(tmp_path / "m.toml", 'batch_size = 8\n[[stages]]\nbrightness = { max_delta = 0.1 }\n')
    environ = {"DATARAX_BATCH_SIZE": "64", "DATARAX_STAGES__0__BRIGHTNESS__MAX_DELTA": "0.3",
               "DATARAX_SOURCE__MEMORY__DATA": "mymod:make", "DATARAX_CI_VENV": "/tmp/venv", "HOME": "/root"}
    loaded = load(main, top_level=TOP, environ=environ)
    assert loaded.raw == {"batch_size": 64, "stages": [{"brightness": {"max_delta": 0.3}}],
                          "source": {"memory": {"data": "mymod:make"}}}
    assert any("DATARAX_BATCH_SIZE" in line for line in loaded.overrides)


def test_near_miss_environment_variables_are_errors_with_a_suggestion(tmp_path):
    main = write(tmp_path / "m.toml", "batch_size = 8\n")
    with pytest.raises(ConfigError, match=r"batchsize \(from environment variable DATARAX_BATCHSIZE\) is not a "
                                          r"known top-level key; did you mean 'batch_size' \(DATARAX_BATCH_SIZE\)\?"):
        load(main, top_level=TOP, environ={"DATARAX_BATCHSIZE": "3"})


def test_set_overrides_win_over_the_environment(tmp_path):
    main = write(tmp_path / "m.toml", "batch_size = 8\n")
    loaded = load(main, top_level=TOP, environ={"DATARAX_BATCH_SIZE": "64"}, overrides=["batch_size=128"])
    assert loaded.raw["batch_size"] == 128


def test_bad_overrides_name_what_is_wrong(tmp_path):
    main = write(tmp_path / "m.toml", '[[stages]]\nbrightness = {}\n')
    with pytest.raises(ConfigError, match=r"--set override 'batch_size' must look like key\.path=value"):
        load(main, top_level=TOP, environ={}, overrides=["batch_size"])
    with pytest.raises(ConfigError, match=r"stages\[3\] \(from override 'stages\[3\]\.brightness\.max_delta=1'\) "
                                          r"does not exist: stages has 1 items"):
        load(main, top_level=TOP, environ={}, overrides=["stages[3].brightness.max_delta=1"])
