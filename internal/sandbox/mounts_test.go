package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
)

// Options.Mounts binds host files read-only: the agent user can run a
// bound binary under /run/kiln, nobody in the sandbox can change it, and a
// bad mount fails the boot; the local provider refuses mounts.
func TestMounts(t *testing.T) {
	dir := t.TempDir()
	tool := filepath.Join(dir, "tool")
	require.NoError(t, os.WriteFile(tool, []byte("#!/bin/sh\necho bound tool\n"), 0o755))
	sb := sandboxtest.Boot(t, helper, sandbox.Options{Mounts: []sandbox.Mount{{Source: tool, Target: "/run/kiln/bin/tool"}}})
	ctx := context.Background()
	cases := []struct {
		name, user, shell, stdout string
		exit                      int
	}{
		{"agent runs it", sandbox.Agent, "/run/kiln/bin/tool", "bound tool\n", 0},
		{"root cannot change it", sandbox.Root, "echo x > /run/kiln/bin/tool", "", 1},
		{"agent cannot change it", sandbox.Agent, "echo x > /run/kiln/bin/tool", "", 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := sb.Exec(ctx, sandbox.Cmd{Shell: c.shell, User: c.user})
			require.NoError(t, err)
			assert.Equal(t, c.exit, res.ExitCode, "%s", res.Stderr)
			assert.Equal(t, c.stdout, string(res.Stdout))
		})
	}
	data, err := os.ReadFile(tool)
	require.NoError(t, err)
	assert.Equal(t, "#!/bin/sh\necho bound tool\n", string(data))

	root := sandboxtest.Require(t)
	for _, m := range []sandbox.Mount{{Source: tool, Target: "relative"}, {Source: filepath.Join(dir, "absent"), Target: "/run/kiln/x"}} {
		_, err := sandbox.Boot(ctx, sandbox.Options{Rootfs: root, HelperPath: helper, Mounts: []sandbox.Mount{m}})
		assert.Error(t, err, "%+v", m)
	}
	_, err = sandbox.Boot(ctx, sandbox.Options{Provider: "local", Rootfs: dir, Mounts: []sandbox.Mount{{Source: tool, Target: "/run/kiln/tool"}}})
	assert.ErrorContains(t, err, "cannot bind mounts")
}
