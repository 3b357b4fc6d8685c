// Package report is kiln report: one self-contained HTML page of a training
// run, read from the store alone (docs/report.md). Gather collects the
// per-step data of a pipeline's targets or of a list of refs; FromMetrics is
// the part of it that reads manifests' metrics only, shared with kiln status
// --table so the demo's table and the page print the same figures.
package report
