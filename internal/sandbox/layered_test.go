package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kilnrl/kiln/internal/sandbox"
	"github.com/kilnrl/kiln/internal/sandbox/sandboxtest"
)

// layeredBundle makes a layered bundle (docs/data-and-grading.md §2.4) of
// n lowers under a new directory and returns its BUNDLE/rootfs: the bottom
// lower is base, the others are made by layer(i, dir) for i = 1..n-1, bottom
// first. The lowers file names them relative to the bundle, as kiln-images
// writes it.
func layeredBundle(t testing.TB, base string, n int, layer func(i int, dir string)) string {
	t.Helper()
	d := t.TempDir()
	bundle := filepath.Join(d, "bundle")
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(bundle, base)
	if err != nil {
		t.Fatal(err)
	}
	lines := []string{rel}
	for i := 1; i < n; i++ {
		dir := filepath.Join(d, "layers", fmt.Sprint(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		layer(i, dir)
		lines = append(lines, "../layers/"+fmt.Sprint(i))
	}
	if err := os.WriteFile(filepath.Join(bundle, "lowers"), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(bundle, "rootfs")
}

func writeFile(t testing.TB, p, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// twentyLayers is layer i of a 20-lower bundle over the base rootfs: each
// adds /kiln-layers/i; layers 3 and 15 write /kiln-over (15 wins); layer 4
// adds /kiln-gone and layer 10 whites it out (a 0/0 character device);
// layer 6 fills /kiln-opq and layer 12 makes it opaque with only b in it.
func twentyLayers(t testing.TB) func(i int, dir string) {
	return func(i int, dir string) {
		writeFile(t, filepath.Join(dir, "kiln-layers", fmt.Sprint(i)), fmt.Sprint(i))
		switch i {
		case 3, 15:
			writeFile(t, filepath.Join(dir, "kiln-over"), fmt.Sprint(i))
		case 4:
			writeFile(t, filepath.Join(dir, "kiln-gone"), "x")
		case 10:
			if err := unix.Mknod(filepath.Join(dir, "kiln-gone"), unix.S_IFCHR, 0); err != nil {
				t.Fatal(err)
			}
		case 6:
			writeFile(t, filepath.Join(dir, "kiln-opq", "a"), "a")
		case 12:
			writeFile(t, filepath.Join(dir, "kiln-opq", "b"), "b")
			if err := unix.Setxattr(filepath.Join(dir, "kiln-opq"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestLayeredBundleTwentyLowers boots the bwrap provider on a layered
// bundle of 20 lowers and checks what the sandbox sees: every layer's file,
// the topmost version of a file written twice, a whiteout and an opaque
// directory applied, the base rootfs underneath (the agent user set up
// from its /etc), and a write that stays in the sandbox.
func TestLayeredBundleTwentyLowers(t *testing.T) {
	base := sandboxtest.Require(t)
	rootfs := layeredBundle(t, base, 20, twentyLayers(t))
	lowers, err := sandbox.LayeredLowers(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	if len(lowers) != 20 || !strings.HasSuffix(lowers[0], "/layers/19") {
		t.Fatalf("LayeredLowers: %d lowers, top %q; want 20, top layers/19", len(lowers), lowers[0])
	}
	sb := sandboxtest.Boot(t, helper, sandbox.Options{Rootfs: rootfs})
	ctx := context.Background()
	var want []string
	for i := 1; i < 20; i++ {
		want = append(want, fmt.Sprint(i))
	}
	for _, c := range []struct {
		name, shell, stdout string
		user                string
	}{
		{"every layer", "cd /kiln-layers && for f in $(ls | sort -n); do cat $f; echo; done", strings.Join(want, "\n") + "\n", ""},
		{"topmost wins", "cat /kiln-over", "15", ""},
		{"whiteout", "test ! -e /kiln-gone && echo gone", "gone\n", ""},
		{"opaque", "ls /kiln-opq", "b\n", ""},
		{"base underneath", "test -x /bin/bash && grep -c bookworm /etc/os-release >/dev/null && echo base", "base\n", ""},
		{"agent", "id -un", "agent\n", sandbox.Agent},
		{"write stays", "echo changed > /kiln-layers/1 && rm /kiln-over && cat /kiln-layers/1", "changed\n", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := sb.Exec(ctx, sandbox.Cmd{Shell: c.shell, User: c.user})
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != 0 || string(res.Stdout) != c.stdout {
				t.Fatalf("exit %d stdout %q stderr %q; want 0 %q", res.ExitCode, res.Stdout, res.Stderr, c.stdout)
			}
		})
	}
	for p, want := range map[string]string{"layers/1/kiln-layers/1": "1", "layers/15/kiln-over": "15"} {
		b, err := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(rootfs)), p))
		if err != nil || string(b) != want {
			t.Errorf("lower %s: %q %v; want %q unchanged", p, b, err, want)
		}
	}
}

// TestLocalRefusesLayeredBundle: the local provider runs commands in a
// host directory and cannot mount lowers; given a layered bundle's
// placeholder rootfs it refuses, saying what to do, instead of running in
// the empty directory.
func TestLocalRefusesLayeredBundle(t *testing.T) {
	base := t.TempDir()
	rootfs := layeredBundle(t, base, 2, func(int, string) {})
	_, err := sandbox.Boot(context.Background(), sandbox.Options{Provider: "local", Rootfs: rootfs})
	if err == nil {
		t.Fatal("the local provider booted on a layered bundle")
	}
	for _, s := range []string{rootfs, "layered bundle", "--layout rootfs"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
}

// TestLayeredLowers reads a bundle's lowers file: top first; a whole-rootfs
// bundle is its rootfs alone; an empty list or a missing layer is an error
// saying to re-import; a bundle reached through a symlink resolves its
// lines from its real directory.
func TestLayeredLowers(t *testing.T) {
	cases := []struct {
		name   string
		lowers *string // the lowers file; nil = none
		link   bool    // reach the bundle through a symlink in another directory
		want   []string
		err    string
	}{
		{"whole rootfs", nil, false, []string{"rootfs"}, ""},
		{"three", ptr("a\n\nb\nc\n"), false, []string{"c", "b", "a"}, ""},
		{"through a symlink", ptr("../sibling\na\n"), true, []string{"a", "../sibling"}, ""},
		{"empty", ptr("\n"), false, nil, "lists no layers"},
		{"missing layer", ptr("a\nnope\n"), false, nil, "a layer of the bundle is missing"},
		{"not a directory", ptr("a\nfile\n"), false, nil, "is not a directory"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tmp, err := filepath.EvalSymlinks(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			bundle := filepath.Join(tmp, "real", "bundle")
			for _, d := range []string{"rootfs", "a", "b", "c", "../sibling"} {
				if err := os.MkdirAll(filepath.Join(bundle, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			writeFile(t, filepath.Join(bundle, "file"), "x")
			if c.lowers != nil {
				writeFile(t, filepath.Join(bundle, "lowers"), *c.lowers)
			}
			at := bundle
			if c.link {
				at = filepath.Join(tmp, "links", "bundle")
				if err := os.MkdirAll(filepath.Dir(at), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(bundle, at); err != nil {
					t.Fatal(err)
				}
			}
			got, err := sandbox.LayeredLowers(filepath.Join(at, "rootfs"))
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v; want one saying %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var rel []string
			for _, g := range got {
				if g == filepath.Join(tmp, "real", "sibling") {
					g = "../sibling"
				}
				rel = append(rel, strings.TrimPrefix(strings.TrimPrefix(g, bundle+"/"), at+"/"))
			}
			if strings.Join(rel, ",") != strings.Join(c.want, ",") {
				t.Fatalf("got %v; want %v", rel, c.want)
			}
		})
	}
}

func ptr(s string) *string { return &s }
