package shellagent

import (
	"debug/elf"
	"fmt"
	"strings"
)

// CheckStatic reports whether the binary at path is a statically linked
// ELF: no program interpreter (PT_INTERP) and no needed libraries
// (DT_NEEDED). kiln-agent is bind-mounted into images that may have any
// libc or none, so the harness checks it before it mounts it; a binary
// built with cgo (the default where a C compiler is installed) fails here,
// not in every sandbox.
func CheckStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: not a static binary (%v): rebuild it with CGO_ENABLED=0 go build ./cmd/kiln-agent (make build does)", path, err)
	}
	defer f.Close()
	var why []string
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			why = append(why, "it has a program interpreter")
			break
		}
	}
	libs, err := f.ImportedLibraries()
	switch {
	case err != nil:
		why = append(why, "its dynamic section: "+err.Error())
	case len(libs) > 0:
		why = append(why, "it needs "+strings.Join(libs, ", "))
	}
	if len(why) > 0 {
		return fmt.Errorf("%s is dynamically linked (%s), so it cannot run in an image with another libc or none: rebuild it with CGO_ENABLED=0 go build ./cmd/kiln-agent (make build does)", path, strings.Join(why, "; "))
	}
	return nil
}
