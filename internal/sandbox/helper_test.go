package sandbox_test

import (
	"debug/elf"
	"testing"
)

// The helper runs inside arbitrary images, so it must not need the host's
// dynamic loader or libc (package sandboxinit must not import net or
// os/user, which pull in cgo).
func TestHelperIsStatic(t *testing.T) {
	f, err := elf.Open(helper)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("kiln-sandbox-helper is dynamically linked; keep net, os/user and cgo out of package sandboxinit")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Fatalf("kiln-sandbox-helper links %v", libs)
	}
}
