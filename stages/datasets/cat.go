package datasets

import (
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

func catCommand(env *Env) *cli.Command {
	var list bool
	return &cli.Command{
		Name:      "cat",
		Usage:     "print an attachment of a version (a grading log, an agent's artifacts)",
		ArgsUsage: "REF ATTACHMENT | --list REF",
		Description: `Copies the attachment ATTACHMENT of REF to stdout, byte for byte, from
whichever store --store names: no aws CLI or bucket credentials beyond kiln's
own are needed. REF is name (the version its latest pointer names) or
name@version; the version must be committed. ATTACHMENT is what the rows
name — the full store key, as a grades row's log column holds it
(grades/step-3/_v/<version>/attachments/logs/<key>.jsonl) — or the path
inside the version's attachments (logs/<key>.jsonl). With a bare name and
a full key, the key's version is the one read; with name@version, a key of
another version is refused, naming it.

--list prints the version's attachments instead, one per line: path, size
in bytes, and the store's time.

Examples:
   kiln cat grades/step-3@5f2c0e9a1b7d3c4e8f60 grades/step-3/_v/5f2c0e9a1b7d3c4e8f60/attachments/logs/12.jsonl
   kiln cat --list grades/step-3
   kiln export grades/step-3 | jq -r 'select(.reward == 0) | .log' | head -1 | xargs kiln cat grades/step-3

Exit status 3: no such version, or no such attachment in it.`,
		Flags: []cli.Flag{
			stagecmd.StoreFlag(),
			&cli.BoolFlag{Name: "list", Aliases: []string{"l"}, Destination: &list, Usage: "list REF's attachments instead of printing one"},
		},
		Action: func(c *cli.Context) error {
			if list {
				if err := stagecmd.RequireArgs(c, 1, "REF (with --list)"); err != nil {
					return err
				}
			} else if err := stagecmd.RequireArgs(c, 2, "REF ATTACHMENT"); err != nil {
				return err
			}
			st, err := stagecmd.OpenExistingStore(c)
			if err != nil {
				return err
			}
			ref, err := dataset.ParseRef(c.Args().First())
			if err != nil {
				return stagecmd.UsageError{Err: err}
			}
			if !ref.Pinned() && !list {
				// A bare name with a key of one of its versions (as rows
				// name them) means that version.
				if rest, ok := strings.CutPrefix(strings.TrimPrefix(c.Args().Get(1), "/"), ref.Name+"/_v/"); ok {
					if version, _, ok := strings.Cut(rest, "/"); ok {
						ref.Version = version
					}
				}
			}
			v, err := dataset.Open(c.Context, st, ref)
			if err != nil {
				return err
			}
			if list {
				return v.Attachments(c.Context, func(rel string, info store.Info) error {
					_, err := fmt.Fprintf(env.Stdout, "%s\t%d\t%s\n", rel, info.Size, info.ModTime.UTC().Format("2006-01-02T15:04:05Z"))
					return err
				})
			}
			rel, err := v.AttachmentPath(c.Args().Get(1))
			if err != nil {
				return stagecmd.UsageError{Err: err}
			}
			rc, _, err := v.OpenAttachment(c.Context, rel)
			if err != nil {
				return fmt.Errorf("%w (kiln cat --list %s lists its attachments)", err, v.Ref())
			}
			defer rc.Close()
			if _, err := io.Copy(env.Stdout, rc); err != nil {
				return fmt.Errorf("cat %s: attachment %q: %w", v.Ref(), rel, err)
			}
			return nil
		},
	}
}
