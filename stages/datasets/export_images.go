package datasets

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"unicode/utf8"

	"github.com/urfave/cli/v2"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/records"
	"github.com/kilnrl/kiln/internal/stagecmd"
)

// formatImagesJSON is kiln export's --format for an images dataset: the
// reference stack's SUNABAKO_IMAGES map (docs/data-and-grading.md §2.2 step 8).
const formatImagesJSON = "images-json"

// imagesRootFlag is export's --bundles (alias --root): the bundle root the
// map's rootfs paths are under (where kiln-images import put the bundles on the sandbox nodes).
func imagesRootFlag(dst *string) cli.Flag {
	return &cli.StringFlag{Name: "bundles", Aliases: []string{"root"}, Destination: dst, Usage: "bundle root of the images (--format images-json; made absolute, symlinks resolved; --root: deprecated alias)"}
}

// exportImagesJSON writes the images map of v:
//
//	{IMAGE: {"rootfs": ROOT/BUNDLE/rootfs, "workdir": W, "env": {...}}, ...}
//
// in row (first-seen) order, entry keys rootfs, workdir, env, env keys in
// image order; 2-space indented, non-ASCII escaped as Python's json.dump
// does by default, with a trailing newline. workdir is the tasks' workdir
// (never the image's WorkingDir) and is left out when the tasks had none,
// so the consumer's default (/testbed) applies. It returns the entry count.
func exportImagesJSON(v *dataset.Version, root string, read func(fn func(records.Image) error) error, w io.Writer) (int, error) {
	if v.Kind().Name != records.ImagesKind().Name {
		return 0, stagecmd.Usagef("export: --format %s needs an images dataset, %s is %s", formatImagesJSON, v.Ref(), v.Kind().Name)
	}
	if root == "" {
		return 0, stagecmd.Usagef("export: --format %s needs --bundles, the bundle root the images were imported under", formatImagesJSON)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return 0, stagecmd.UsageError{Err: fmt.Errorf("--bundles %q: %w", root, err)}
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	} else if !os.IsNotExist(err) {
		return 0, fmt.Errorf("--bundles %q: %w", root, err)
	}
	var b bytes.Buffer
	b.WriteByte('{')
	n := 0
	err = read(func(im records.Image) error {
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		writeString(&b, im.Image)
		b.WriteString(`:{"rootfs":`)
		writeString(&b, filepath.Join(abs, filepath.FromSlash(im.Bundle), "rootfs"))
		if im.Workdir != nil {
			b.WriteString(`,"workdir":`)
			writeString(&b, *im.Workdir)
		}
		b.WriteString(`,"env":`)
		b.WriteString(im.Env)
		b.WriteByte('}')
		return nil
	})
	if err != nil {
		return 0, err
	}
	b.WriteByte('}')
	var out bytes.Buffer
	if err := json.Indent(&out, b.Bytes(), "", "  "); err != nil {
		return 0, fmt.Errorf("export %s: %w: %w", v.Ref(), err, dataset.ErrCorrupt)
	}
	out.WriteByte('\n')
	_, err = w.Write(asciiJSON(out.Bytes()))
	return n, err
}

func writeString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)
	b.Truncate(b.Len() - 1)
}

// asciiJSON escapes every non-ASCII character of JSON text as \uXXXX
// (surrogate pairs above U+FFFF), as Python's ensure_ascii does. Non-ASCII
// bytes only occur inside strings, so this is safe on whole documents.
func asciiJSON(b []byte) []byte {
	var out bytes.Buffer
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		switch {
		case r < utf8.RuneSelf:
			out.WriteByte(b[0])
		case r > 0xffff:
			r -= 0x10000
			fmt.Fprintf(&out, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
		default:
			fmt.Fprintf(&out, `\u%04x`, r)
		}
		b = b[size:]
	}
	return out.Bytes()
}

// exportImages runs --format images-json for the export command.
func exportImages(c *cli.Context, env *Env, v *dataset.Version, o exportFlags) error {
	read := func(fn func(records.Image) error) error {
		return v.EachShard(c.Context, func(_ int, data []byte) error { return records.EachImage(data, fn) })
	}
	var n int
	out := o.out
	err := writeOutput(out, env.Stdout, func(w io.Writer) error {
		var err error
		n, err = exportImagesJSON(v, o.bundles, read, w)
		return err
	})
	if err != nil || out == "" || out == "-" {
		return err
	}
	abs, _ := filepath.Abs(out)
	var b bytes.Buffer
	writeString(&b, abs)
	stagecmd.Fprintln(c, string(asciiJSON([]byte(fmt.Sprintf(`{"output": %s, "images": %d}`, b.String(), n)))))
	return nil
}
