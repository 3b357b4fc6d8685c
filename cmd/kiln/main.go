// Command kiln manages kiln datasets (ls, show, log, export, import, gc) and
// runs the other kiln binaries git-style: "kiln convert" is "kiln-convert".
package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
	"github.com/kilnrl/kiln/stages/datasets"
)

func main() {
	env := &datasets.Env{Stdout: os.Stdout, Stderr: os.Stderr, Log: stagecmd.NewLogger(os.Stderr, false)}
	app := env.App(&cli.App{
		Name:  "kiln",
		Usage: "versioned datasets and stages for coding-agent RL",
		Description: `kiln is a batch system on files: stage binaries read and write versioned
Arrow/Parquet datasets in a store (a directory, or s3://bucket/prefix).
"kiln NAME ..." runs the binary kiln-NAME (beside kiln, or on PATH), so
"kiln convert --help" is "kiln-convert --help".`,
		Commands: datasets.Commands(env),
	})
	if len(os.Args) > 2 && (os.Args[1] == "help" || os.Args[1] == "h") && app.Command(os.Args[2]) == nil {
		// "kiln help convert" is "kiln-convert --help" (and "kiln help
		// convert mimo" "kiln-convert help mimo").
		if path := stagecmd.Dispatch("kiln", os.Args[2]); path != "" {
			args := append([]string{path}, os.Args[3:]...)
			if len(os.Args) == 3 {
				args = append(args, "--help")
			} else {
				args = append([]string{path, "help"}, os.Args[3:]...)
			}
			err := stagecmd.Exec(path, args)
			fmt.Fprintf(os.Stderr, "kiln: running %s: %v\n", path, err)
			os.Exit(stagecmd.ExitFailure)
		}
	}
	if len(os.Args) > 1 && app.Command(os.Args[1]) == nil && os.Args[1][0] != '-' {
		if path := stagecmd.Dispatch("kiln", os.Args[1]); path != "" {
			err := stagecmd.Exec(path, append([]string{path}, os.Args[2:]...))
			fmt.Fprintf(os.Stderr, "kiln: running %s: %v\n", path, err)
			os.Exit(stagecmd.ExitFailure)
		}
		fmt.Fprintf(os.Stderr, "kiln: %q is not a kiln command, and no kiln-%s binary is beside kiln or on PATH; see kiln --help\n", os.Args[1], os.Args[1])
		os.Exit(stagecmd.ExitUsage)
	}
	os.Exit(stagecmd.Main(app, os.Args, os.Stderr))
}
