package grade

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

type patchGot struct {
	n, ord        int
	taskID, patch string
}

func collectPatches(data []byte) ([]patchGot, error) {
	var got []patchGot
	err := readPatches(bytes.NewReader(data), "p.json", func(n, ord int, taskID, patch string, _ *int64) error {
		got = append(got, patchGot{n, ord, taskID, patch})
		return nil
	})
	return got, err
}

func TestReadPatchesStrict(t *testing.T) {
	row := `{"task_id": "a", "patch": "x"}`
	pred := `{"instance_id": "b", "model_patch": null}`
	cases := []struct {
		name, data string
		rows       int    // on success
		err        string // "" = success; else exit 5 and this substring
	}{
		{"json lines", row + "\n\n" + pred + "\n", 2, ""},
		{"json lines without final newline", row + "\n" + pred, 2, ""},
		{"array", "[" + row + ",\n" + pred + "]\n", 2, ""},
		{"array with spaces around", "  \n[ " + row + " ]  \n", 1, ""},
		{"unterminated array", "[" + row + ",\n" + pred, 0, "the array is not closed"},
		{"unterminated array after a comma", "[" + row + ",", 0, `element 2`},
		{"array missing a comma", "[" + row + " " + pred + "]", 0, "element 2"},
		{"trailing garbage after the array", "[" + row + "] x", 0, "after the closing ']'"},
		{"a second array", "[" + row + "][" + row + "]", 0, "after the closing ']'"},
		{"trailing garbage on a line", row + " x\n", 0, "row 1: not a JSON object"},
		{"truncated line", row + "\n" + `{"task_id": "b", "pat`, 0, "row 2"},
		{"empty file", "", 0, "is empty"},
		{"only blank lines", "\n \n\t\n", 0, "is empty"},
		{"empty array", "[]", 0, "empty array"},
		{"array of numbers", "[1, 2]", 0, "row 1: not a JSON object"},
		{"only an opening bracket", "[", 0, "the array is not closed after element 0"},
		{"no patch key", `{"task_id": "a"}`, 0, `no "patch" key`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := collectPatches([]byte(c.data))
			if c.err == "" {
				require.NoError(t, err)
				assert.Len(t, got, c.rows)
				return
			}
			require.Error(t, err)
			assert.Equal(t, stagecmd.ExitBadInput, stagecmd.ExitCode(err), "%v", err)
			assert.Contains(t, err.Error(), c.err)
			assert.Contains(t, err.Error(), `"p.json"`, "names the file")
		})
	}
}

// FuzzReadPatches: whatever the bytes, readPatches never panics, fails
// only with invalid input (exit 5: it reads memory, so no I/O error), and
// accepts a JSON array only when encoding/json reads the whole input as an
// array of that many elements, and JSON lines only when every non-blank
// line is a JSON value. Success always means at least one row.
func FuzzReadPatches(f *testing.F) {
	for _, s := range []string{
		`{"task_id": "a", "patch": "x"}` + "\n",
		`[{"instance_id": "b", "model_patch": "d"}]`,
		`[{"instance_id": "b", "model_patch": "d"}`,
		`[{"task_id": "a", "patch": ""}] garbage`,
		"",
		"[]",
		"\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := collectPatches(data)
		if err != nil {
			var bad stagecmd.BadInputError
			if !errors.As(err, &bad) {
				t.Fatalf("not classified as invalid input: %v", err)
			}
			return
		}
		if len(got) == 0 {
			t.Fatalf("success with no rows")
		}
		trimmed := bytes.TrimLeft(data, " \t\r\n")
		if len(trimmed) > 0 && trimmed[0] == '[' {
			var all []json.RawMessage
			if err := json.Unmarshal(data, &all); err != nil {
				t.Fatalf("accepted an array encoding/json rejects: %v", err)
			}
			if len(all) != len(got) {
				t.Fatalf("%d rows, encoding/json reads %d elements", len(got), len(all))
			}
			return
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.TrimSpace(line) != "" && !json.Valid([]byte(line)) {
				t.Fatalf("accepted a line that is not JSON: %q", line)
			}
		}
	})
}
