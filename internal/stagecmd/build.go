package stagecmd

import (
	"runtime/debug"
	"sync"
)

// Build identifies the running binary: its module version, or the VCS
// revision it was built from ("+dirty" if the tree had changes). It is
// recorded in manifests for provenance and never hashed into version ids.
func Build() string { return build() }

var build = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return bi.Main.Version
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "+dirty"
	}
	return rev
})
