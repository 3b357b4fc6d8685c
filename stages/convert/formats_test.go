package convert_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

func grading(t *testing.T, g *string) map[string]any {
	t.Helper()
	require.NotNil(t, g)
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(*g), &m))
	return m
}

func TestSWEBenchRows(t *testing.T) {
	rows := []map[string]any{
		sweRow("a__b-1", "a/b", "parse_log_pytest"),
		sweRow("d__j-2", "django/django", "parse_log_django"),
		sweRow("a__b-3", "a/b", "pytest"),
	}
	delete(rows[2], "install_config")
	rows[2]["test_cmd"], rows[2]["log_parser"], rows[2]["workdir"] = "python -m pytest", "pytest", "/work"
	data := writeJSONL(t, rows)

	t.Run("ungradeable left out and reported", func(t *testing.T) {
		storeDir := t.TempDir()
		res := run(t, "swebench", "--store", storeDir, "--data", data, "--out", "tasks/swe")
		require.Equal(t, 0, res.Code, res.Stderr)
		assert.Contains(t, res.Stderr, "count=1")
		assert.Contains(t, res.Stderr, "ids=d__j-2")
		v := manifest(t, storeDir, res.LastLine())
		m := jsonRound(v.Metrics)
		assert.Equal(t, 1.0, m["ungradeable"])
		assert.Equal(t, []any{"d__j-2"}, m["ungradeable_ids"])
		tasks := readTasks(t, storeDir, res.LastLine())
		require.Len(t, tasks, 2)
		g := grading(t, tasks[0].Grading)
		assert.Equal(t, map[string]any{"kind": "swebench", "test_patch": rows[0]["test_patch"],
			"fail_to_pass": []any{"tests/test_a.py::test_one"}, "pass_to_pass": []any{"tests/test_a.py::test_two"},
			"test_cmd": "pytest -rA", "log_parser": "pytest", "base_commit": "abc123"}, g)
		assert.Equal(t, "a/b", *tasks[0].Repo)
		assert.Equal(t, "/testbed", *tasks[0].Workdir)
		assert.Equal(t, "root", *tasks[0].EvalUser)
		assert.Equal(t, "swebench", *tasks[0].Dataset)
		assert.JSONEq(t, `[{"role":"user","content":"Fix a__b-1"}]`, tasks[0].Prompt)
		assert.JSONEq(t, `{"hints_text":"","install_config":{"test_cmd":"pytest -rA","log_parser":"parse_log_pytest","python":"3.11"}}`, tasks[0].Metadata)
		assert.Equal(t, "/work", *tasks[1].Workdir)
		assert.Equal(t, "python -m pytest", grading(t, tasks[1].Grading)["test_cmd"])

		// Exported for the reference's swebench protocol: remote_env_info.
		exp := export(t, storeDir, res.LastLine())
		rei := exp[0]["metadata"].(map[string]any)["remote_env_info"].(map[string]any)
		assert.Equal(t, "abc123", rei["base_commit"])
		assert.Equal(t, rows[0]["test_patch"], rei["test_patch"])
		assert.Equal(t, []any{"tests/test_a.py::test_one"}, rei["FAIL_TO_PASS"])
	})
	t.Run("keep-ungradeable", func(t *testing.T) {
		storeDir := t.TempDir()
		res := run(t, "swebench", "--store", storeDir, "--data", data, "--out", "tasks/swe", "--keep-ungradeable")
		require.Equal(t, 0, res.Code, res.Stderr)
		assert.Len(t, readTasks(t, storeDir, res.LastLine()), 3)
	})
	t.Run("all ungradeable", func(t *testing.T) {
		res := run(t, "swebench", "--store", t.TempDir(), "--data", writeJSONL(t, rows[1:2]), "--out", "tasks/swe")
		assert.Equal(t, stagecmd.ExitBadInput, res.Code)
		assert.Contains(t, res.Stderr, "--keep-ungradeable keeps them")
	})
	t.Run("bad rows", func(t *testing.T) {
		cases := []struct {
			edit func(r map[string]any)
			want string
		}{
			{func(r map[string]any) { delete(r, "base_commit") }, `line 1, instance "a__b-1": required key "base_commit" is missing or null`},
			{func(r map[string]any) { r["test_patch"] = "  " }, `"test_patch" is blank`},
			{func(r map[string]any) { r["FAIL_TO_PASS"] = "nope" }, `key "FAIL_TO_PASS" is not a list of strings (nor a JSON-encoded one)`},
			{func(r map[string]any) { r["FAIL_TO_PASS"] = 3 }, `key "FAIL_TO_PASS" is not a list of strings`},
			{func(r map[string]any) { delete(r, "image") }, `required key "image" is missing`},
			{func(r map[string]any) { r["test_patch"] = "diff --git a//abs b//abs\n" }, "Test patch escapes repository"},
			{func(r map[string]any) { delete(r, "instance_id") }, `line 1: required key "instance_id" is missing`},
		}
		for _, c := range cases {
			r := sweRow("a__b-1", "a/b", "pytest")
			c.edit(r)
			storeDir := t.TempDir()
			res := run(t, "swebench", "--store", storeDir, "--data", writeJSONL(t, []map[string]any{r}), "--out", "tasks/swe")
			assert.Equal(t, stagecmd.ExitBadInput, res.Code, res.Stderr)
			assert.Contains(t, res.Stderr, c.want)
			noVersions(t, storeDir)
		}
	})
}

// TestSWEBenchParquet reads SWE-rebench-shaped Parquet: list columns and a
// struct install_config.
func TestSWEBenchParquet(t *testing.T) {
	type installConfig struct {
		TestCmd   string `parquet:"test_cmd"`
		LogParser string `parquet:"log_parser"`
	}
	type row struct {
		InstanceID       string        `parquet:"instance_id"`
		Repo             string        `parquet:"repo"`
		BaseCommit       string        `parquet:"base_commit"`
		ProblemStatement string        `parquet:"problem_statement"`
		TestPatch        string        `parquet:"test_patch"`
		FailToPass       []string      `parquet:"FAIL_TO_PASS,list"`
		PassToPass       []string      `parquet:"PASS_TO_PASS,list"`
		DockerImage      string        `parquet:"docker_image"`
		CreatedAt        int64         `parquet:"created_at"`
		InstallConfig    installConfig `parquet:"install_config"`
	}
	patch := "diff --git a/t.py b/t.py\n"
	path := filepath.Join(t.TempDir(), "rebench.parquet")
	writeParquet(t, path, []row{
		{"x__y-1", "x/y", "c1", "PS1", patch, []string{"t.py::a"}, []string{}, "img:1", 5, installConfig{"pytest -rA", "parse_log_pytest"}},
		{"x__y-2", "x/y", "c2", "PS2", patch, []string{"t.py::b"}, []string{"t.py::c"}, "img:2", 6, installConfig{"pytest -rA", "parse_log_pytest"}},
		{"z__w-1", "z/w", "c3", "PS3", patch, []string{"t.py::d"}, nil, "img:3", 7, installConfig{"pytest -rA", "parse_log_pytest"}},
	})
	storeDir := t.TempDir()
	res := run(t, "swebench", "--store", storeDir, "--data", path, "--out", "tasks/rebench")
	require.Equal(t, 0, res.Code, res.Stderr)
	tasks := readTasks(t, storeDir, res.LastLine())
	require.Len(t, tasks, 3)
	g := grading(t, tasks[1].Grading)
	assert.Equal(t, []any{"t.py::b"}, g["fail_to_pass"])
	assert.Equal(t, []any{"t.py::c"}, g["pass_to_pass"])
	assert.Equal(t, "pytest", g["log_parser"])
	assert.Equal(t, "img:2", *tasks[1].Image)
	assert.JSONEq(t, `{"created_at":6,"install_config":{"test_cmd":"pytest -rA","log_parser":"parse_log_pytest"}}`, tasks[1].Metadata)
}

func TestSWEProRows(t *testing.T) {
	scripts := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(scripts, "pro-1"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(scripts, "pro-1", "run_script.sh"), []byte("#!/bin/bash\npytest \"$1\"\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(scripts, "pro-1", "parser.py"), []byte("print('parse')\n"), 0o644))
	abs := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(abs, "run.sh"), []byte("run2"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(abs, "parse.py"), []byte("parse2"), 0o644))
	rows := []map[string]any{
		// A flat SWE-bench Pro dataset row.
		{"instance_id": "pro-1", "repo": "org/app", "base_commit": "b1", "problem_statement": "Do it",
			"fail_to_pass": `["t::a"]`, "pass_to_pass": `["t::b"]`, "selected_test_files_to_run": `["t.py"]`,
			"before_repo_set_cmd": "git checkout b1", "dockerhub_tag": "org.app-1", "requirements": "R"},
		// A reference row (metadata.swepro) naming its scripts by path.
		{"prompt": []map[string]string{{"role": "user", "content": "Do two"}}, "label": "pro-2",
			"metadata": map[string]any{"instance_id": "pro-2", "image": "img:2", "workdir": "/app", "problem_statement": "Do two",
				"swepro": map[string]any{"run_script_path": filepath.Join(abs, "run.sh"), "parser_script_path": filepath.Join(abs, "parse.py"),
					"selected_test_files": []string{"t2.py"}, "fail_to_pass": []string{"t2::a"}, "pass_to_pass": []string{}}}},
	}
	data := writeJSONL(t, rows)
	storeDir := t.TempDir()
	res := run(t, "swepro", "--store", storeDir, "--data", data, "--scripts", scripts, "--out", "tasks/pro")
	require.Equal(t, 0, res.Code, res.Stderr)
	tasks := readTasks(t, storeDir, res.LastLine())
	require.Len(t, tasks, 2)
	assert.Equal(t, map[string]any{"kind": "swepro", "swepro": map[string]any{
		"before_repo_set_cmd": "git checkout b1", "selected_test_files": []any{"t.py"}, "fail_to_pass": []any{"t::a"},
		"pass_to_pass": []any{"t::b"}, "run_script": "#!/bin/bash\npytest \"$1\"\n", "parser_script": "print('parse')\n"}}, grading(t, tasks[0].Grading))
	assert.Equal(t, "jefzda/sweap-images:org.app-1", *tasks[0].Image)
	assert.Equal(t, "/app", *tasks[0].Workdir)
	assert.Equal(t, "org/app", *tasks[0].Repo)
	assert.JSONEq(t, `{"base_commit":"b1","requirements":"R"}`, tasks[0].Metadata)
	g2 := grading(t, tasks[1].Grading)["swepro"].(map[string]any)
	assert.Equal(t, "run2", g2["run_script"])
	assert.Equal(t, "parse2", g2["parser_script"])
	// Exported, the payload is metadata.swepro, as the reference reads it.
	exp := export(t, storeDir, res.LastLine())
	assert.Equal(t, "run2", exp[1]["metadata"].(map[string]any)["swepro"].(map[string]any)["run_script"])

	t.Run("script content is part of the version", func(t *testing.T) {
		before := run(t, "swepro", "--store", storeDir, "--data", data, "--scripts", scripts, "--out", "tasks/pro", "--print-version").LastLine()
		require.NoError(t, os.WriteFile(filepath.Join(abs, "parse.py"), []byte("parse3"), 0o644))
		after := run(t, "swepro", "--store", storeDir, "--data", data, "--scripts", scripts, "--out", "tasks/pro", "--print-version").LastLine()
		assert.NotEqual(t, before, after)
	})
	t.Run("missing script", func(t *testing.T) {
		require.NoError(t, os.Remove(filepath.Join(scripts, "pro-1", "parser.py")))
		storeDir := t.TempDir()
		res := run(t, "swepro", "--store", storeDir, "--data", data, "--scripts", scripts, "--out", "tasks/pro")
		assert.Equal(t, stagecmd.ExitBadInput, res.Code, res.Stderr)
		assert.Contains(t, res.Stderr, `line 1, instance "pro-1": script "`+filepath.Join(scripts, "pro-1", "parser.py"))
		noVersions(t, storeDir)
	})
}

func TestF2PRows(t *testing.T) {
	script := "import sys, pytest\n\ndef test_x():\n    assert True\n\nsys.exit(pytest.main([__file__]))\n"
	rows := []map[string]any{
		// The older sweb shape: everything in remote_env_info, a string prompt.
		{"prompt": "Fix inventory", "label": "inv-1", "metadata": map[string]any{"remote_env_info": map[string]any{
			"instance_id": "inv-1", "image_url": "img:inv", "workdir": "/testbed", "f2p_script": script}}},
		// Flat, with a repository.
		{"instance_id": "flat-1", "problem_statement": "Flat", "image": "img:flat", "workdir": "/w", "f2p_script": script, "repo": "o/r"},
	}
	storeDir := t.TempDir()
	res := run(t, "f2p", "--store", storeDir, "--data", writeJSONL(t, rows), "--out", "tasks/f2p")
	require.Equal(t, 0, res.Code, res.Stderr)
	tasks := readTasks(t, storeDir, res.LastLine())
	require.Len(t, tasks, 2)
	assert.Equal(t, map[string]any{"kind": "f2p", "f2p_script": script}, grading(t, tasks[0].Grading))
	assert.Equal(t, `"Fix inventory"`, tasks[0].Prompt, "a reference prompt is kept as written")
	assert.Equal(t, "Fix inventory", *tasks[0].ProblemStatement)
	assert.Equal(t, "img:inv", *tasks[0].Image)
	assert.Nil(t, tasks[0].Repo)
	assert.Equal(t, "o/r", *tasks[1].Repo)
	exp := export(t, storeDir, res.LastLine())
	assert.Equal(t, script, exp[0]["metadata"].(map[string]any)["remote_env_info"].(map[string]any)["f2p_script"])

	bad := []map[string]any{{"instance_id": "x", "problem_statement": "p", "image": "i", "workdir": "/w", "f2p_script": ""}}
	res = run(t, "f2p", "--store", t.TempDir(), "--data", writeJSONL(t, bad), "--out", "tasks/f2p")
	assert.Equal(t, stagecmd.ExitBadInput, res.Code)
	assert.Contains(t, res.Stderr, `instance "x": key "f2p_script" is blank`)
}
