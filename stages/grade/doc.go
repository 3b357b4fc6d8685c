// Package grade is kiln-grade: it grades agent patches with each task's
// official tests, every patch in a fresh sandbox booted from the task's
// image bundle, and writes a grades dataset (docs/records.md §1; docs/data-and-grading.md §5).
//
// The pieces:
//   - Grader.Grade (grader.go) is one grading: sandbox, agent user, SWE-bench
//     Pro setup, pre_commands, the patch applied (three methods, worktree
//     reset between them), one grading path. Every outcome is an Outcome with
//     a failure class and a log; nothing but cancellation is an error.
//   - ParseGrading (grading.go) decodes the tasks grading column kiln-convert
//     writes: eval_cmd, swebench, swepro, f2p.
//   - ParsePytestLog (pytestlog.go) is the pytest log parser of swebench
//     grading; kiln parses logs itself instead of running the SWE-bench
//     harness.
//   - Run (command.go) reads the inputs, grades with -j workers and commits
//     the rows in receipted shards, so a rerun resumes; the grading logs go
//     to the store before their rows.
package grade
