package stagecmd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
)

func TestExitCode(t *testing.T) {
	cases := []struct {
		err  error
		code int
	}{
		{nil, ExitOK},
		{errors.New("boom"), ExitFailure},
		{Usagef("bad flag"), ExitUsage},
		{fmt.Errorf("x: %w", dataset.ErrNotFound), ExitNotFound},
		{fmt.Errorf("x: %w", store.ErrNotExist), ExitNotFound},
		{fmt.Errorf("open: %w", fs.ErrNotExist), ExitNotFound},
		{fmt.Errorf("shard: %w", dataset.ErrCorrupt), ExitCorrupt},
		{BadInputError{errors.New("line 3")}, ExitBadInput},
		{fmt.Errorf("run: %w", context.Canceled), ExitCancelled},
		{fmt.Errorf("run: %w", context.DeadlineExceeded), ExitFailure},
		{BadInputf("layer 2: %w", errors.New("unsafe")), ExitBadInput},
		{fmt.Errorf("image %q: %w", "x", BadInputError{errors.New("escapes the root")}), ExitBadInput},
		{fmt.Errorf("show: %w", mustBadRef("tasks/mimo@ZZZ!")), ExitUsage},
		{fmt.Errorf("show: %w", mustBadRef("../x")), ExitUsage},
		{fmt.Errorf("write: %w", syscall.ENOSPC), ExitFailure},
		{fmt.Errorf("write: %w", fs.ErrPermission), ExitFailure},
		{cli.Exit("library says", 3), ExitNotFound},
		{cli.Exit("library says", 1), ExitFailure},
		{UsageError{fmt.Errorf("x: %w", dataset.ErrNotFound)}, ExitUsage},
		{BadInputError{fmt.Errorf("x: %w", fs.ErrNotExist)}, ExitBadInput},
		{fmt.Errorf("image: %w", CorruptError{errors.New("existing bundle does not match")}), ExitCorrupt},
	}
	for _, c := range cases {
		assert.Equal(t, c.code, ExitCode(c.err), "%v", c.err)
	}
}

func mustBadRef(s string) error {
	_, err := dataset.ParseRef(s)
	if err == nil {
		panic(s + " parses")
	}
	return err
}

func TestPartFromEnv(t *testing.T) {
	cases := []struct {
		env  map[string]string
		want dataset.Part
		err  string
	}{
		{map[string]string{}, dataset.Part{}, ""},
		{map[string]string{"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "4"}, dataset.Part{Index: 2, Count: 4}, ""},
		{map[string]string{"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "1"}, dataset.Part{Index: 3, Count: 4}, ""},
		{map[string]string{"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "4"}, dataset.Part{}, "pass --shard i/n"},
		{map[string]string{"SLURM_ARRAY_TASK_ID": "x", "SLURM_ARRAY_TASK_COUNT": "4"}, dataset.Part{}, "pass --shard i/n"},
	}
	for _, c := range cases {
		p, err := PartFromEnv(func(k string) string { return c.env[k] })
		if c.err != "" {
			require.ErrorContains(t, err, c.err)
			assert.Equal(t, ExitUsage, ExitCode(err))
			continue
		}
		require.NoError(t, err)
		assert.Equal(t, c.want, p)
	}
}

func TestResolveInputsPins(t *testing.T) {
	st, err := store.NewLocal(t.TempDir())
	require.NoError(t, err)
	ctx := context.Background()
	_, err = ResolveInputs(ctx, st, []string{"tasks"}, dataset.Part{})
	assert.ErrorIs(t, err, dataset.ErrNotFound)
	_, err = ResolveInputs(ctx, st, []string{"tasks"}, dataset.Part{Index: 0, Count: 2})
	assert.Equal(t, ExitUsage, ExitCode(err))
	assert.ErrorContains(t, err, `input "tasks" is not pinned`)
	refs, err := ResolveInputs(ctx, st, []string{"tasks@abc"}, dataset.Part{Index: 0, Count: 2})
	require.NoError(t, err)
	assert.Equal(t, "tasks@abc", refs[0].String())
}
