package convert

import (
	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

const commonHelp = `
Every run writes one version of the tasks kind through the store (--store) and
prints the committed reference (NAME@VERSION) as the last line of stdout; an
identical earlier run is found, not redone. The version id covers the inputs'
content (a file's sha256, an S3 object's ETag and size) and the arguments.

Splits: --split train=0.9,eval=0.1 assigns whole split units to one split, so
no repository is in two splits; a unit is the row's repository, or the task
itself when rows carry none (MiMo rows do not). Units are shuffled by --seed
and placed largest first into the split furthest below its share, so each
split ends within about one unit of its fraction (exactly so for two splits). The split column holds the name;
without --split it is null. --limit N keeps N tasks per split (or overall),
drawn by --seed round-robin across repositories. With --split or --limit the
input is read twice.

Bad input fails the run with exit status 5, naming the file, the row (Parquet
row or JSONL line, from 1) and the instance id, and commits nothing: a missing
or null required field (stricter than the reference, which passes some nulls
through), duplicate instance ids among the selected rows, --ids naming an id
twice or ids not in the input (listed, sorted), a test patch path outside the
repository, a Parquet file without the expected columns.`

// Commands returns the kiln-convert subcommands, one per input format.
func Commands(env *stagecmd.Env) []*cli.Command {
	return []*cli.Command{
		command(env, "mimo", "convert the MiMo code subset (code.parquet + image-mapping.jsonl)",
			"--data DIR|s3://bucket/prefix --out NAME [--ids ID...]",
			`Reads DIR/code.parquet (only the struct column extra_info, field
instance_json: one JSON object per row, streamed a page at a time) and
DIR/image-mapping.jsonl ({"dataset_image": ..., "dockerhub_image": ...} per
line; a later line for the same dataset_image wins). Each row's keys
instance_id, problem_statement, docker_image, cwd, test_patch and test_command
are required strings. The task:

   prompt             [{"role": "user", "content": problem_statement}] and
                      nothing else: the tests never reach the agent
   image              the mapping's dockerhub_image for docker_image
   workdir            cwd
   eval_user          root (MiMo images set up toolchains in root's profile)
   grading            {"kind": "eval_cmd", "eval_cmd": CMD, "test_patch",
                      "test_command", "docker_image", "other_keys"}
   dataset            XiaomiMiMo/MiMo-V2.6-RL-oss (--dataset to change)

CMD is the reference's command byte for byte: bash -lc with set -e; reset
every path named in the test patch's diff --git headers to HEAD (or delete it
when HEAD lacks it); decode the base64 test patch to /tmp/mimo-tests.patch and
git apply it; run test_command. A header path that is absolute or has a ".."
component fails the row ("Test patch escapes repository").

Output order is the Parquet order. --ids converts only the named instances
(each once; rows not selected are not checked, as in the reference). kiln
export tasks --format jsonl gives the reference's rows {prompt, label,
metadata} back (as equal JSON).`+commonHelp+`

Example:
   kiln convert mimo --data /data/mimo --out tasks/mimo --split train=0.95,eval=0.05`),
		command(env, "swebench", "convert SWE-bench-style rows (SWE-bench Verified, SWE-rebench)",
			"--data FILE|DIR --out NAME",
			`Reads rows from Parquet or JSONL (.zst allowed) files, or every such file
in DIR in name order. Flat rows and reference rows (metadata.remote_env_info)
are both read. Required: instance_id, repo, base_commit, problem_statement, a
non-blank test_patch, FAIL_TO_PASS and PASS_TO_PASS (lists or JSON-encoded
lists) and the image (image, image_name or docker_image); workdir (or cwd)
defaults to /testbed. The test command and log parser come from test_cmd and
log_parser, else SWE-rebench's install_config.

grading is {"kind": "swebench", "test_patch", "fail_to_pass", "pass_to_pass",
"test_cmd", "log_parser", "base_commit"}; eval_user is root; repo is set and
is the split unit; every other key is kept in metadata.

kiln departs from the reference here: the reference grades these rows with
the official SWE-bench harness; kiln grades by test name, parsing the test
log with its own parsers (today: pytest). Rows without a test command or
naming another parser cannot be graded: they are reported (count and ids in
the log and in the version's metrics) and left out, unless
--keep-ungradeable.`+commonHelp),
		command(env, "swepro", "convert SWE-bench Pro rows, embedding their run and parser scripts",
			"--data FILE|DIR [--scripts DIR] --out NAME",
			`Reads SWE-bench Pro rows (Parquet or JSONL): flat rows (the SWE-bench Pro
dataset's columns) or reference rows with metadata.swepro (docs/data-and-grading.md §1.7). Required:
instance_id, problem_statement, fail_to_pass and pass_to_pass (lists or
JSON-encoded lists), the image (image, image_name, or dockerhub_tag under
jefzda/sweap-images) and the two scripts: the row's run_script_path and
parser_script_path (relative ones under --scripts), else
SCRIPTS/<instance_id>/run_script.sh and parser.py. They are read now and
embedded (and their content is part of the version id):

   grading  {"kind": "swepro", "swepro": {"before_repo_set_cmd",
            "selected_test_files", "fail_to_pass", "pass_to_pass",
            "run_script", "parser_script"}}

workdir defaults to /app. Reward (grade stage): every fail_to_pass and
pass_to_pass test PASSED in the parser's result.`+commonHelp),
		command(env, "f2p", "convert f2p-script rows (a self-contained pytest file per task)",
			"--data FILE|DIR --out NAME",
			`Reads f2p-script rows (Parquet or JSONL; flat, or reference rows with
metadata.remote_env_info.f2p_script). Required: instance_id (or the reference
row's label), problem_statement, image, workdir and a non-blank f2p_script,
carried verbatim: grading is {"kind": "f2p", "f2p_script": SCRIPT}; the grader
writes it to a file and runs it with python in the workdir (exit 0: solved).
repo, when present, is the split unit.`+commonHelp),
		harborCommand(env),
	}
}

const harborHelp = `Reads Harbor task directories (Terminal-Bench 2.0, Harbor's registry
adapters): each DIR is one task (it holds task.toml) or a directory whose
subdirectories holding task.toml are tasks, taken in name order. A task is
task.toml (either schema form: version = "1.0" with [metadata], or
schema_version = "1.1" with [task]), instruction.md, environment/ (a
Dockerfile and its context, or [environment].docker_image), tests/test.sh and,
optionally, solution/solve.sh. The task:

   task_id            [task].name, else the directory's name
   prompt             [{"role": "user", "content": instruction.md}]
   problem_statement  instruction.md
   image              [environment].docker_image (kiln-images import), else
                      kiln.local/harbor-build:<sha256 of environment/>, which
                      kiln-images build makes from environment/Dockerfile
   workdir            --workdir, else [metadata].workdir, else the Dockerfile's
                      last WORKDIR, else /app
   eval_user          [verifier].user, else root
   pre_commands       [metadata].pre_commands (kiln's own key, a string or a
                      list of strings; kiln export --format harbor writes it)
   grading            {"kind": "harbor", "tests", "solution", verifier timeout,
                      user and env, the solution's env, "reward_metric",
                      "memory_mb"}
   metadata           {"harbor": {"schema", "task_toml" (the whole file, every
                      key), "unknown_keys", "build"}}

tests/, solution/ and (for a Dockerfile) environment/ are packed as
reproducible tars and stored as attachments of the version, named by their
sha256 (harbor/sha256/HEX.tar): never inside an image, so the agent's sandbox
never holds them. kiln-grade uploads tests/ to /tests only after the patch is
applied. The reward is /logs/verifier/reward.json's metric (--reward-metric,
or the task's [metadata].reward_metric, else "reward", else its only metric)
or reward.txt's number, in [0, 1].

Tasks kiln cannot grade (a docker-compose.yaml environment, os = "windows",
gpus > 0) are reported and left out unless --keep-ungradeable. The mapping of
every task.toml key, and what is unsupported and why, is
docs/data-and-grading.md §7.

A malformed task.toml (a syntax error, a value of the wrong type, a timeout or
a resource that is not positive) exits 5 naming the file, the line and the
key; a task without instruction.md or tests/test.sh exits 5 naming it.

Every run writes one version of the tasks kind through the store (--store) and
prints the committed reference (NAME@VERSION) as the last line of stdout; the
version id covers every file of every task directory (by content) and the
arguments.

Example:
   kiln convert harbor ./terminal-bench-2 --out tasks/tb2`

func harborCommand(env *stagecmd.Env) *cli.Command {
	f := &flags{}
	var workdir, metric string
	fl := []cli.Flag{
		stagecmd.StoreFlag(),
		&cli.StringFlag{Name: "out", Value: "tasks/harbor", Destination: &f.out, Usage: "dataset name to write"},
		&cli.StringFlag{Name: "split", Destination: &f.split, Usage: "NAME=FRACTION,... e.g. train=0.9,eval=0.1"},
		&cli.Uint64Flag{Name: "seed", Destination: &f.seed, Usage: "seed of --split and --limit"},
		&cli.IntFlag{Name: "limit", Destination: &f.limit, Usage: "keep at most N tasks per split"},
		&cli.StringFlag{Name: "dataset", Destination: &f.dataset, Usage: "the dataset column (default: harbor)"},
		&cli.StringFlag{Name: "workdir", Destination: &workdir, Usage: "every task's workdir (the repository the agent's patch is taken in)"},
		&cli.StringFlag{Name: "reward-metric", Destination: &metric, Usage: "the reward.json metric that is the reward (default: reward)"},
		&cli.BoolFlag{Name: "keep-ungradeable", Destination: &f.keepUngradeable, Usage: "keep tasks kiln cannot grade (compose, windows, GPU)"},
		stagecmd.ShardFlag(),
		stagecmd.PrintVersionFlag(&f.printVersion),
	}
	return &cli.Command{
		Name: "harbor", Usage: "convert Harbor task directories (task.toml, instruction.md, environment/, tests/, solution/)",
		ArgsUsage: "DIR...", Description: harborHelp, Flags: fl,
		Action: func(c *cli.Context) error {
			st, err := stagecmd.OpenStore(c)
			if err != nil {
				return err
			}
			part, err := stagecmd.PartFrom(c)
			if err != nil {
				return err
			}
			splits, err := ParseSplits(f.split)
			if err != nil {
				return stagecmd.UsageError{Err: err}
			}
			o := Options{Format: "harbor", Dirs: c.Args().Slice(), Splits: splits, Seed: f.seed, Limit: f.limit,
				KeepUngradeable: f.keepUngradeable, Dataset: f.dataset, Workdir: workdir, RewardMetric: metric}
			out := stagecmd.Output{Name: f.out, Part: part, PrintVersion: f.printVersion, Hook: env.Hook}
			_, err = Run(c.Context, env, st, out, o)
			return err
		},
	}
}

// flags are a conversion's flags, bound.
type flags struct {
	data, out, split, dataset, scripts string
	ids                                cli.StringSlice
	seed                               uint64
	limit                              int
	keepUngradeable, printVersion      bool
}

func command(env *stagecmd.Env, format, usage, args, desc string) *cli.Command {
	f := &flags{}
	fl := []cli.Flag{
		stagecmd.StoreFlag(),
		&cli.StringFlag{Name: "data", Required: true, Destination: &f.data, Usage: "the input (see above)"},
		&cli.StringFlag{Name: "out", Value: "tasks/" + format, Destination: &f.out, Usage: "dataset name to write"},
		&cli.StringSliceFlag{Name: "ids", Destination: &f.ids, Usage: "convert only these instance ids (repeat the flag, or comma-separate; extra arguments are ids too)"},
		&cli.StringFlag{Name: "split", Destination: &f.split, Usage: "NAME=FRACTION,... e.g. train=0.9,eval=0.1: whole units per split"},
		&cli.Uint64Flag{Name: "seed", Destination: &f.seed, Usage: "seed of --split and --limit"},
		&cli.IntFlag{Name: "limit", Destination: &f.limit, Usage: "keep at most N tasks per split, spread across repositories"},
		&cli.StringFlag{Name: "dataset", Destination: &f.dataset, Usage: "the dataset column (default: the format's source name)"},
		stagecmd.ShardFlag(),
		stagecmd.PrintVersionFlag(&f.printVersion),
	}
	switch format {
	case "swebench":
		fl = append(fl, &cli.BoolFlag{Name: "keep-ungradeable", Destination: &f.keepUngradeable, Usage: "keep rows whose log parser kiln does not implement"})
	case "swepro":
		fl = append(fl, &cli.StringFlag{Name: "scripts", Destination: &f.scripts, Usage: "directory of <instance_id>/run_script.sh and parser.py (and of relative script paths rows name)"})
	}
	return &cli.Command{
		Name: format, Usage: usage, ArgsUsage: args, Description: desc, Flags: fl,
		Action: func(c *cli.Context) error { return action(c, env, format, f) },
	}
}

func action(c *cli.Context, env *stagecmd.Env, format string, f *flags) error {
	st, err := stagecmd.OpenStore(c)
	if err != nil {
		return err
	}
	part, err := stagecmd.PartFrom(c)
	if err != nil {
		return err
	}
	splits, err := ParseSplits(f.split)
	if err != nil {
		return stagecmd.UsageError{Err: err}
	}
	// --ids takes several values, as the reference's nargs="+": the flag
	// may repeat, and the arguments after it are ids too.
	ids := append(f.ids.Value(), c.Args().Slice()...)
	if c.NArg() > 0 && len(f.ids.Value()) == 0 {
		return stagecmd.Usagef("%s: unexpected arguments %q; ids go after --ids", c.Command.FullName(), c.Args().Slice())
	}
	o := Options{
		Format: format, Data: f.data, Scripts: f.scripts, IDs: ids,
		Splits: splits, Seed: f.seed, Limit: f.limit,
		KeepUngradeable: f.keepUngradeable, Dataset: f.dataset,
	}
	out := stagecmd.Output{Name: f.out, Part: part, PrintVersion: f.printVersion, Hook: env.Hook}
	_, err = Run(c.Context, env, st, out, o)
	return err
}
