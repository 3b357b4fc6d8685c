package grade

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseGrading(t *testing.T) {
	cases := []struct {
		name, col string
		kind      string // "" = no grading path
		err       string
	}{
		{"null", "null", "", ""},
		{"eval_cmd", `{"kind":"eval_cmd","eval_cmd":"true","test_patch":"x"}`, KindEvalCmd, ""},
		{"blank eval_cmd is absent", `{"kind":"eval_cmd","eval_cmd":"  "}`, "", ""},
		{"f2p", `{"kind":"f2p","f2p_script":"import sys"}`, KindF2P, ""},
		{"swepro", `{"kind":"swepro","swepro":{"run_script":"x","parser_script":"y","fail_to_pass":["a"]}}`, KindSWEPro, ""},
		{"swepro without scripts", `{"kind":"swepro","swepro":{"fail_to_pass":["a"]}}`, "", "neither run_script nor parser_script"},
		{"swepro without payload", `{"kind":"swepro"}`, "", `no "swepro" object`},
		{"swebench", `{"kind":"swebench","test_cmd":"pytest -rA","log_parser":"pytest","fail_to_pass":["a::b"]}`, KindSWEBench, ""},
		{"swebench unknown parser", `{"kind":"swebench","test_cmd":"x","log_parser":"django"}`, "", `log parser "django" is not implemented`},
		{"swebench no command", `{"kind":"swebench","log_parser":"pytest"}`, "", "no test_cmd"},
		{"unknown kind", `{"kind":"docker"}`, "", `unknown grading kind "docker"`},
		{"not an object", `[1]`, "", "not a JSON object"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g, err := ParseGrading(&c.col)
			if c.err != "" {
				assert.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			if c.kind == "" {
				assert.Nil(t, g)
				return
			}
			require.NotNil(t, g)
			assert.Equal(t, c.kind, g.Kind)
		})
	}
	g, err := ParseGrading(nil)
	assert.NoError(t, err)
	assert.Nil(t, g)
}

func TestTestFiles(t *testing.T) {
	g := &Grading{
		TestPatch:  "diff --git a/tests/test_new.py b/tests/test_new.py\n--- /dev/null\n+++ b/tests/test_new.py\ndiff --git a/run.sh b/run.sh\n--- /dev/null\n+++ b/run.sh\n",
		FailToPass: []string{"tests/test_new.py::test_a", "tests/test_new.py::test_p[x y]"},
		PassToPass: []string{"tests/test_old.py::TestC::test_b", "test_django (app.tests.T)", "./tests/test_old.py::test_c"},
	}
	assert.Equal(t, []string{"tests/test_new.py", "tests/test_old.py"}, testFiles(g))
}

func TestPreCommandsBody(t *testing.T) {
	cases := []struct {
		name string
		col  *string
		want string
		err  string
	}{
		{"none", nil, "", ""},
		{"null", ptrTo("null"), "", ""},
		{"string with literal backslash-n", ptrTo(`"pip install -e .\\nexport A=1"`), "pip install -e .\nexport A=1", ""},
		{"list drops empties", ptrTo(`["a", "", "b"]`), "a\nb", ""},
		{"list of non-strings", ptrTo(`["a", 1]`), "", "item 1 is not a string"},
		{"object", ptrTo(`{"a":1}`), "", "neither a string nor a list"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := preCommandsBody(c.col)
			if c.err != "" {
				assert.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}
