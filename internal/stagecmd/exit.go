package stagecmd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
)

// Exit codes. Scripts and the pipeline runner branch on them; they are an
// API and never change meaning.
const (
	ExitOK        = 0 // success (also: the version already existed)
	ExitFailure   = 1 // any other failure
	ExitUsage     = 2 // bad flags or arguments; nothing was done
	ExitNotFound  = 3 // a dataset, version or input file does not exist
	ExitCorrupt   = 4 // stored data fails its checks (checksum, manifest, schema)
	ExitBadInput  = 5 // an input's content is invalid (a malformed row)
	ExitCancelled = 130
)

// ExitStatusHelp is the EXIT STATUS section every binary's help ends with.
const ExitStatusHelp = `EXIT STATUS:
   0    success; for writing commands the committed reference is the last line
        of stdout (also when an identical earlier run had already committed it)
   1    failure not covered below (store unreachable, I/O error, ...); retrying may help
   2    usage error: bad flags or arguments; nothing was done
   3    not found: a dataset, version or input file does not exist
   4    corrupt: stored data fails its checks (checksum, manifest, schema)
   5    bad input: an input file's content is invalid
   130  interrupted`

// UsageError marks an error as a usage error (exit 2).
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// Usagef returns a UsageError.
func Usagef(format string, args ...any) error { return UsageError{fmt.Errorf(format, args...)} }

// BadInputError marks an error as invalid input content (exit 5).
type BadInputError struct{ Err error }

func (e BadInputError) Error() string { return e.Err.Error() }
func (e BadInputError) Unwrap() error { return e.Err }

// CorruptError marks an error as stored data failing its checks (exit 4),
// for data kept outside datasets (an image bundle on a node); datasets
// wrap dataset.ErrCorrupt instead.
type CorruptError struct{ Err error }

func (e CorruptError) Error() string { return e.Err.Error() }
func (e CorruptError) Unwrap() error { return e.Err }

// BadInputf returns a BadInputError.
func BadInputf(format string, args ...any) error { return BadInputError{fmt.Errorf(format, args...)} }

// ExitCode maps an error to the exit status; this is the one place that
// does. Errors carry their class: UsageError (and a malformed dataset
// reference, dataset.ErrBadRef; a write of another kind than the dataset
// holds, dataset.ErrKindMismatch), dataset.ErrCorrupt or CorruptError,
// BadInputError, the
// not-found sentinels, context.Canceled; an error of the flag library that
// carries its own code (cli.ExitCoder) keeps it. Anything else is a
// failure a retry may fix.
func ExitCode(err error) int {
	var usage UsageError
	var bad BadInputError
	var corrupt CorruptError
	var ec cli.ExitCoder
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, context.Canceled):
		return ExitCancelled
	case errors.As(err, &usage):
		return ExitUsage
	case errors.Is(err, dataset.ErrCorrupt), errors.As(err, &corrupt):
		return ExitCorrupt
	case errors.As(err, &bad):
		return ExitBadInput
	case errors.Is(err, dataset.ErrBadRef), errors.Is(err, dataset.ErrKindMismatch):
		return ExitUsage
	case errors.Is(err, dataset.ErrNotFound), errors.Is(err, store.ErrNotExist), errors.Is(err, fs.ErrNotExist):
		return ExitNotFound
	case errors.As(err, &ec) && ec.ExitCode() > ExitFailure:
		return ec.ExitCode()
	}
	return ExitFailure
}
