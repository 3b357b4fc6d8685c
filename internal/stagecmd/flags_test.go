package stagecmd

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"
)

func TestOpenStore(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	missing := filepath.Join(dir, "missing")
	cases := []struct {
		cmd, store string
		code       int
		stderr     string
	}{
		{"read", dir, ExitOK, ""},
		{"read", missing, ExitNotFound, `store "` + missing + `" does not exist: check --store`},
		{"read", file, ExitUsage, `store "` + file + `" is a file, not a directory`},
		{"read", "s3:bucket", ExitUsage, "malformed URI"},
		{"write", missing, ExitOK, ""},
		{"write", file, ExitUsage, `store "` + file + `" is a file, not a directory`},
	}
	for _, c := range cases {
		t.Run(c.cmd+" "+c.store, func(t *testing.T) {
			var out, errb bytes.Buffer
			open := func(c *cli.Context) error { _, err := OpenExistingStore(c); return err }
			write := func(c *cli.Context) error { _, err := OpenStore(c); return err }
			app := CommonApp(&cli.App{Name: "kiln-x", Commands: []*cli.Command{
				{Name: "read", Flags: []cli.Flag{StoreFlag()}, Action: open},
				{Name: "write", Flags: []cli.Flag{StoreFlag()}, Action: write},
			}}, &out, &errb)
			code := Main(app, []string{"kiln-x", c.cmd, "--store", c.store}, &errb)
			assert.Equal(t, c.code, code, errb.String())
			assert.Contains(t, errb.String(), c.stderr)
		})
	}
	_, err := os.Stat(missing)
	assert.ErrorIs(t, err, os.ErrNotExist, "opening creates nothing")
}
