package pipelines

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestIncludeBounded: an include of a device or of a file past the size
// bound is an error naming it, read no further than the bound (issue 31:
// `include /dev/zero` read 24 GB until the kernel killed kiln).
func TestIncludeBounded(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.kiln")
	if err := os.WriteFile(big, []byte("# "+strings.Repeat("x", maxSpecBytes)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, include, want string }{
		{"a device", "/dev/zero", "not a regular file"},
		{"a directory", dir, "not a regular file"},
		{"past the bound", big, "over 1048576 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "main.kiln")
			if err := os.WriteFile(path, []byte("include "+tc.include+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Load(path, nil, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "main.kiln:1") {
				t.Fatalf("Load with include %s = %v; want an error at main.kiln:1 saying %q", tc.include, err, tc.want)
			}
		})
	}
	if _, err := Load("/dev/zero", nil, nil); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("Load(/dev/zero) = %v; want not a regular file", err)
	}
}
