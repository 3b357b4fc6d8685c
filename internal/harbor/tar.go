package harbor

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// MaxDirBytes bounds what TarDir packs: tests/, solution/ and environment/
// travel in memory and as one attachment each.
const MaxDirBytes = 1 << 30

// TarDir packs dir as a reproducible tar: entries in lexical order, names
// relative to dir, owner 0:0, time zero, modes 0755 for directories and
// for files with any execute bit, 0644 for the other files; symlinks kept
// as they are. Anything else (a device, a FIFO, a socket) is an error
// naming it. The same tree always gives the same bytes, so its sha256
// (returned in hex) names its content: kiln stores it at AttachmentPath.
func TarDir(dir string) ([]byte, string, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h := &tar.Header{Name: rel, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		switch m := fi.Mode(); {
		case m.IsDir():
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, rel+"/", 0o755
		case m.IsRegular():
			h.Typeflag, h.Size, h.Mode = tar.TypeReg, fi.Size(), 0o644
			if m&0o111 != 0 {
				h.Mode = 0o755
			}
			total += fi.Size()
			if total > MaxDirBytes {
				return fmt.Errorf("%q is over %d bytes: too large to carry with the task", dir, MaxDirBytes)
			}
		case m&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, target, 0o777
		default:
			return fmt.Errorf("%q is neither a file, a directory nor a symlink: a task carries only those", p)
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.CopyN(tw, f, h.Size)
			f.Close()
			if err != nil {
				return fmt.Errorf("reading %q: %w", p, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("packing %q: %w", dir, err)
	}
	if err := tw.Close(); err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(buf.Bytes())
	return buf.Bytes(), hex.EncodeToString(sum[:]), nil
}

// AttachmentPath is where a packed directory with that sha256 lives among
// a tasks version's attachments: content-addressed, so tasks sharing
// tests share one file.
func AttachmentPath(hexSum string) string { return "harbor/sha256/" + hexSum + ".tar" }

// UntarDir writes a tar made by TarDir (or any tar of plain files,
// directories and symlinks) into dir, refusing entries that climb out of
// it. kiln export uses it to write tests/ and solution/ back.
func UntarDir(data []byte, dir string) error {
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the packed directory: %w", err)
		}
		name := path.Clean(h.Name)
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("packed entry %q climbs out of its directory", h.Name)
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fs.FileMode(h.Mode)&0o755)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("packed entry %q has type %q: want files, directories and symlinks", h.Name, h.Typeflag)
		}
	}
}
