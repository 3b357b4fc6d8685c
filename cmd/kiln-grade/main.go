// Command kiln-grade grades agent patches with the tasks' official tests in
// fresh sandboxes and writes a grades dataset (see stages/grade).
package main

import (
	"os"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/grade"
)

func main() {
	os.Exit(stagecmd.Run(grade.App))
}
