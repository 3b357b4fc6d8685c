package gitdiff

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestPatchPaths(t *testing.T) {
	cases := []struct {
		name, diff string
		want       []string
	}{
		{"git diff", "diff --git a/x.py b/x.py\nindex 1..2 100644\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n", []string{"x.py"}},
		{"rename", "diff --git a/old.py b/new.py\nsimilarity index 90%\nrename from old.py\nrename to new.py\n", []string{"old.py", "new.py"}},
		{"new and deleted", "diff --git a/n b/n\nnew file mode 100644\n--- /dev/null\n+++ b/n\ndiff --git a/d b/d\ndeleted file mode 100644\n--- a/d\n+++ /dev/null\n", []string{"n", "d"}},
		{"spaces", "diff --git a/a dir/f.py b/a dir/f.py\n--- a/a dir/f.py\n+++ b/a dir/f.py\n", []string{"a dir/f.py"}},
		{"quoted", "diff --git \"a/caf\\303\\251.py\" \"b/caf\\303\\251.py\"\n--- \"a/caf\\303\\251.py\"\n+++ \"b/caf\\303\\251.py\"\n", []string{"café.py"}},
		{"plain diff with dates", "--- a/f.c\t2024-01-01 00:00:00\n+++ b/f.c\t2024-01-02 00:00:00\n@@ -1 +1 @@\n", []string{"f.c"}},
		{"escapes left out", "diff --git a/../etc/passwd b/../etc/passwd\n--- a//etc/x\n+++ b//etc/x\n", nil},
		{"crlf", "diff --git a/w.py b/w.py\r\n--- a/w.py\r\n+++ b/w.py\r\n", []string{"w.py"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, Paths(c.diff))
		})
	}
}
