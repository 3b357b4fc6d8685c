package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDispatch builds kiln and checks git-style dispatch to kiln-NAME
// binaries beside kiln or on PATH, with arguments and exit status passed
// through.
func TestDispatch(t *testing.T) {
	bin := t.TempDir()
	kiln := filepath.Join(bin, "kiln")
	build := exec.Command("go", "build", "-o", kiln, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, string(out))

	onPath := t.TempDir()
	stub := "#!/bin/sh\necho \"$0 called with: $*\"\nexit 7\n"
	require.NoError(t, os.WriteFile(filepath.Join(onPath, "kiln-convert"), []byte(stub), 0o755))
	env := append(os.Environ(), "PATH="+onPath+string(os.PathListSeparator)+os.Getenv("PATH"))

	run := func(args ...string) (string, int) {
		cmd := exec.Command(kiln, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			require.NoError(t, err)
		}
		return string(out), code
	}

	out1, code := run("convert", "--help", "x y")
	assert.Equal(t, 7, code)
	assert.Contains(t, out1, filepath.Join(onPath, "kiln-convert")+" called with: --help x y")

	// A binary beside kiln wins over PATH.
	require.NoError(t, os.WriteFile(filepath.Join(bin, "kiln-convert"), []byte("#!/bin/sh\necho beside $*\n"), 0o755))
	out2, code := run("convert", "mimo")
	assert.Equal(t, 0, code)
	assert.Equal(t, "beside mimo\n", out2)

	out3, code := run("frobnicate")
	assert.Equal(t, 2, code)
	assert.Contains(t, out3, `"frobnicate" is not a kiln command, and no kiln-frobnicate binary`)

	out4, code := run("ls", "--store", t.TempDir())
	assert.Equal(t, 0, code, out4)
	assert.Contains(t, out4, "DATASET")
}
