package images

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

// Hook points of an import (tests kill importers there).
const (
	HookLayerPartial = "images:layer-partial" // part of a layer is on disk, in the temporary bundle
	HookBeforeRename = "images:before-rename" // the temporary bundle is complete, not yet in place
	// HookLayerBeforeRename: a layer's temporary directory is complete,
	// not yet in place in the layer store.
	HookLayerBeforeRename = "images:layer-before-rename"
	// HookLayerPlaced: a layer is in place, its bundle not yet.
	HookLayerPlaced = "images:layer-placed"
)

// ImageJSON is bundle/image.json, beside rootfs/ (docs/data-and-grading.md §2.3):
// the first five fields are the reference's contract, the rest is kiln's.
type ImageJSON struct {
	Image          string `json:"image"` // the reference that first imported the bundle
	ManifestDigest string `json:"manifest_digest"`
	// Env is the config Env as an object, split at the first "=", in image
	// order (a repeated key keeps its first position and last value).
	Env       json.RawMessage `json:"env"`
	Cwd       string          `json:"cwd"`     // the config WorkingDir, "/" when unset
	Command   []string        `json:"command"` // Entrypoint followed by Cmd
	Source    string          `json:"source"`
	Layers    int             `json:"layers"`
	SizeBytes int64           `json:"size_bytes"` // uncompressed layer bytes
	Files     int64           `json:"files"`      // layer entries applied
	Notes     []string        `json:"notes,omitempty"`
	// Lowers are the layer-store directories of a layered bundle, relative
	// to the bundle root, bottom first (docs/data-and-grading.md §2.4);
	// empty for a whole-rootfs bundle.
	Lowers []string `json:"lowers,omitempty"`
}

// BundleRel is the bundle directory of a manifest digest, relative to the
// bundle root: ALGO/HEX.
func BundleRel(digest v1.Hash) string { return digest.Algorithm + "/" + digest.Hex }

// importer makes bundles under one root.
type importer struct {
	root     string // absolute, symlinks resolved
	rootless bool
	log      *slog.Logger
	stderr   io.Writer
	hook     func(point string)
	sync     bool // syncfs before the rename
	// layered: make layered bundles over the layer store (root only);
	// otherwise whole-rootfs bundles.
	layered bool
	// store counts the layer-store directories unpacked and reused.
	storeUnpacked, storeReused atomic.Int64
}

func (im *importer) fire(point string) {
	if im.hook != nil {
		im.hook(point)
	}
}

// ensure returns the bundle of res, unpacking it unless a complete bundle
// of the same manifest digest is already in place. A per-digest flock makes
// concurrent importers on one node (Slurm array tasks) do the work once:
// the others wait, then find the bundle.
func (im *importer) ensure(ctx context.Context, res *resolved) (info ImageJSON, unpacked bool, err error) {
	dir := filepath.Join(im.root, res.digest.Algorithm)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return info, false, fmt.Errorf("bundle root %q: %w", im.root, err)
	}
	final := filepath.Join(dir, res.digest.Hex)
	unlock, err := lockFile(ctx, filepath.Join(dir, "."+res.digest.Hex+".lock"), im.log, res.image)
	if err != nil {
		return info, false, err
	}
	defer unlock()
	if info, ok, err := readBundle(final, res.image, res.digest.String()); ok || err != nil {
		return info, false, err
	}
	if res.img == nil { // resolved from a bundle that has since disappeared
		return info, false, fmt.Errorf("image %q: bundle %q disappeared during the import; run it again", res.image, final)
	}
	// Leftovers of a killed import of this digest: ours to remove, since we
	// hold its lock.
	old, _ := filepath.Glob(filepath.Join(dir, ".tmp-"+res.digest.Hex+"-*"))
	for _, o := range old {
		im.log.Info("removing an interrupted import", "dir", o)
		if err := removeTree(o); err != nil {
			return info, false, fmt.Errorf("remove interrupted import %q: %w", o, err)
		}
	}
	tmp, err := os.MkdirTemp(dir, ".tmp-"+res.digest.Hex+"-")
	if err != nil {
		return info, false, err
	}
	defer func() {
		if err != nil {
			removeTree(tmp)
		}
	}()
	if im.layered {
		info, err = im.unpackLayered(ctx, res, tmp)
	} else {
		info, err = im.unpack(ctx, res, tmp)
	}
	if err != nil {
		return info, false, err
	}
	im.fire(HookBeforeRename)
	if err := os.Rename(tmp, final); err != nil {
		return info, false, fmt.Errorf("image %q: put bundle in place at %q: %w", res.image, final, err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return info, true, nil
}

// readBundle reads an existing bundle; ok is false when there is none. A
// bundle is reused only when its image.json names the same manifest digest
// and rootfs/ is a directory.
func readBundle(final, image, digest string) (ImageJSON, bool, error) {
	var info ImageJSON
	if _, err := os.Lstat(final); errors.Is(err, fs.ErrNotExist) {
		return info, false, nil
	}
	// "Existing bundle does not match" is the reference's message, capitalised.
	b, err := os.ReadFile(filepath.Join(final, "image.json"))
	if err != nil {
		// %v, not %w: a bundle without image.json is damaged, not "not found" (exit 3).
		return info, true, stagecmd.CorruptError{Err: fmt.Errorf("Existing bundle does not match %s: %s: %v (remove the directory to re-import)", image, final, err)}
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return info, true, stagecmd.CorruptError{Err: fmt.Errorf("Existing bundle does not match %s: %s: image.json: %w (remove the directory to re-import)", image, final, err)}
	}
	fi, err := os.Lstat(filepath.Join(final, "rootfs"))
	if info.ManifestDigest != digest || err != nil || !fi.IsDir() {
		return info, true, stagecmd.CorruptError{Err: fmt.Errorf("Existing bundle does not match %s: %s (image.json manifest_digest %q, want %q, rootfs a directory: %v; remove the directory to re-import)",
			image, final, info.ManifestDigest, digest, err == nil && fi.IsDir())}
	}
	// A layered bundle is complete only with every layer it lists.
	for _, l := range info.Lowers {
		root := filepath.Dir(filepath.Dir(final))
		if fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(l), "fs")); err != nil || !fi.IsDir() {
			return info, true, stagecmd.CorruptError{Err: fmt.Errorf("Existing bundle does not match %s: %s: its layer %q is missing from the layer store (remove the bundle directory to re-import)", image, final, l)}
		}
	}
	return info, true, nil
}

// imageParts are what unpacking an image reads before its layers.
type imageParts struct {
	where  string
	cfg    *v1.ConfigFile
	layers []v1.Layer
	descs  []v1.Descriptor // nil when only diff ids can be checked
}

// prepare reads and checks res's config and layer list.
func prepare(res *resolved) (imageParts, error) {
	p := imageParts{where: fmt.Sprintf("image %q (%s)", res.image, res.digest)}
	rawCfg, err := res.img.RawConfigFile()
	if err != nil {
		return p, fmt.Errorf("%s: config: %w", p.where, err)
	}
	if p.cfg, err = v1.ParseConfigFile(bytes.NewReader(rawCfg)); err != nil {
		return p, fmt.Errorf("%s: config: %w", p.where, err)
	}
	if p.layers, err = res.img.Layers(); err != nil {
		return p, fmt.Errorf("%s: layers: %w", p.where, err)
	}
	if !res.uncompressed {
		m, err := res.img.Manifest()
		if err != nil {
			return p, fmt.Errorf("%s: manifest: %w", p.where, err)
		}
		sum := sha256.Sum256(rawCfg)
		if got := "sha256:" + hex.EncodeToString(sum[:]); got != m.Config.Digest.String() {
			return p, stagecmd.BadInputf("%s: config blob has digest %s, the manifest says %s: the source is corrupt", p.where, got, m.Config.Digest)
		}
		p.descs = m.Layers
	}
	if len(p.cfg.RootFS.DiffIDs) != len(p.layers) {
		return p, stagecmd.BadInputf("%s: the config lists %d diff ids for %d layers", p.where, len(p.cfg.RootFS.DiffIDs), len(p.layers))
	}
	return p, nil
}

// applyLayer verifies layer i of p and applies it with u, with a progress
// report; it returns the uncompressed size.
func (im *importer) applyLayer(ctx context.Context, res *resolved, p imageParts, u *unpacker, i int) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	name := p.cfg.RootFS.DiffIDs[i].String()
	var want *v1.Hash
	var size int64 = -1
	if p.descs != nil {
		name, want, size = p.descs[i].Digest.String(), &p.descs[i].Digest, p.descs[i].Size
	}
	// One report per layer: a bar of its (compressed) bytes on a terminal,
	// a log line when it is done otherwise.
	prog := stagecmd.NewProgress(im.stderr, im.log, fmt.Sprintf("%s layer %d/%d", res.image, i+1, len(p.layers)), stagecmd.UnitBytes, size)
	n, err := im.layer(ctx, u, i, name, p.layers[i], want, p.cfg.RootFS.DiffIDs[i], res.uncompressed, prog)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p.where, err)
	}
	prog.Done()
	return n, nil
}

// finishInfo fills image.json's config-derived fields and writes it.
func (im *importer) writeInfo(info *ImageJSON, cfg *v1.ConfigFile, tmp string) error {
	info.Env = envObject(cfg.Config.Env)
	info.Cwd = cfg.Config.WorkingDir
	if info.Cwd == "" {
		info.Cwd = "/"
	}
	info.Command = append(append([]string{}, cfg.Config.Entrypoint...), cfg.Config.Cmd...)
	b, _ := json.MarshalIndent(info, "", "  ")
	return os.WriteFile(filepath.Join(tmp, "image.json"), append(b, '\n'), 0o644)
}

// unpack writes rootfs/ and image.json into the temporary bundle tmp.
func (im *importer) unpack(ctx context.Context, res *resolved, tmp string) (ImageJSON, error) {
	info := ImageJSON{Image: res.image, ManifestDigest: res.digest.String(), Source: res.source}
	where := fmt.Sprintf("image %q (%s)", res.image, res.digest)
	rawCfg, err := res.img.RawConfigFile()
	if err != nil {
		return info, fmt.Errorf("%s: config: %w", where, err)
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(rawCfg))
	if err != nil {
		return info, fmt.Errorf("%s: config: %w", where, err)
	}
	layers, err := res.img.Layers()
	if err != nil {
		return info, fmt.Errorf("%s: layers: %w", where, err)
	}
	var descs []v1.Descriptor
	if !res.uncompressed {
		m, err := res.img.Manifest()
		if err != nil {
			return info, fmt.Errorf("%s: manifest: %w", where, err)
		}
		sum := sha256.Sum256(rawCfg)
		if got := "sha256:" + hex.EncodeToString(sum[:]); got != m.Config.Digest.String() {
			return info, stagecmd.BadInputf("%s: config blob has digest %s, the manifest says %s: the source is corrupt", where, got, m.Config.Digest)
		}
		descs = m.Layers
	}
	if len(cfg.RootFS.DiffIDs) != len(layers) {
		return info, stagecmd.BadInputf("%s: the config lists %d diff ids for %d layers", where, len(cfg.RootFS.DiffIDs), len(layers))
	}
	rootfs := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return info, err
	}
	u, err := newUnpacker(rootfs, im.rootless)
	if err != nil {
		return info, err
	}
	defer u.close()
	for i, l := range layers {
		if err := ctx.Err(); err != nil {
			return info, err
		}
		name := cfg.RootFS.DiffIDs[i].String()
		var want *v1.Hash
		if descs != nil {
			name, want = descs[i].Digest.String(), &descs[i].Digest
		}
		// One report per layer: a bar of its (compressed) bytes on a
		// terminal, a log line when it is done otherwise.
		var size int64 = -1
		if want != nil {
			size = descs[i].Size
		}
		prog := stagecmd.NewProgress(im.stderr, im.log, fmt.Sprintf("%s layer %d/%d", res.image, i+1, len(layers)), stagecmd.UnitBytes, size)
		n, err := im.layer(ctx, u, i, name, l, want, cfg.RootFS.DiffIDs[i], res.uncompressed, prog)
		if err != nil {
			return info, fmt.Errorf("%s: %w", where, err)
		}
		prog.Done()
		info.SizeBytes += n
	}
	if err := u.finish(); err != nil {
		return info, fmt.Errorf("%s: %w", where, err)
	}
	info.Layers, info.Files, info.Notes = len(layers), u.entries, u.notes
	if len(u.notes) > 0 {
		im.log.Info("notes", "image", res.image, "summary", summarizeNotes(u.noteCounts),
			"list", filepath.Join(im.root, BundleRel(res.digest), "image.json"))
	}
	info.Env = envObject(cfg.Config.Env)
	info.Cwd = cfg.Config.WorkingDir
	if info.Cwd == "" {
		info.Cwd = "/"
	}
	info.Command = append(append([]string{}, cfg.Config.Entrypoint...), cfg.Config.Cmd...)
	b, _ := json.MarshalIndent(info, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "image.json"), append(b, '\n'), 0o644); err != nil {
		return info, err
	}
	if im.sync {
		if err := syncfs(tmp); err != nil {
			return info, fmt.Errorf("%s: sync: %w", where, err)
		}
	}
	return info, nil
}

// layer verifies and applies layer i; it returns the uncompressed size.
// The compressed stream is hashed against the manifest digest and the tar
// stream against the config's diff id, both read to the end, so a
// tampered or truncated blob fails the import (the temporary bundle is
// then discarded).
func (im *importer) layer(ctx context.Context, u *unpacker, i int, name string, l v1.Layer, want *v1.Hash, diffID v1.Hash, uncompressed bool, prog *stagecmd.Progress) (int64, error) {
	var rc io.ReadCloser
	var err error
	if uncompressed {
		rc, err = l.Uncompressed()
	} else {
		rc, err = l.Compressed()
	}
	if err != nil {
		return 0, fmt.Errorf("layer %d (%s): open: %w", i, name, err)
	}
	defer rc.Close()
	hc := sha256.New()
	cr := &countingReader{r: rc, h: hc, add: prog.Add}
	br := bufio.NewReaderSize(cr, 1<<20)
	var plain io.Reader = br
	magic, _ := br.Peek(4)
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		zr, err := gzip.NewReader(br)
		if err != nil {
			return 0, stagecmd.BadInputf("layer %d (%s): gzip: %w", i, name, err)
		}
		defer zr.Close()
		plain = zr
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br)
		if err != nil {
			return 0, fmt.Errorf("layer %d (%s): zstd: %w", i, name, err)
		}
		defer zr.Close()
		plain = zr
	}
	hu := sha256.New()
	ur := &countingReader{r: plain, h: hu}
	// Reading, hashing and decompressing run in their own goroutine, ahead
	// of the tar parsing and file writes here: two cores instead of one.
	ra := newReadAhead(ur, func() error {
		_, err := io.Copy(io.Discard, cr) // bytes after the compressed stream count for the digest
		return err
	})
	defer ra.Close()
	entries := 0
	err = u.applyLayer(i, name, ra, func() {
		if entries++; entries == 1 {
			im.fire(HookLayerPartial)
		}
	})
	if err != nil {
		return 0, err
	}
	if _, err := io.Copy(io.Discard, ra); err != nil { // the tar's padding
		return 0, fmt.Errorf("layer %d (%s): %w", i, name, err)
	}
	if err := ra.Close(); err != nil {
		return 0, fmt.Errorf("layer %d (%s): %w", i, name, err)
	}
	if got := hex.EncodeToString(hu.Sum(nil)); got != diffID.Hex {
		return 0, stagecmd.BadInputf("layer %d (%s): uncompressed content has sha256:%s, the config's diff id is %s: the source is corrupt", i, name, got, diffID)
	}
	if want != nil {
		if got := hex.EncodeToString(hc.Sum(nil)); got != want.Hex {
			return 0, stagecmd.BadInputf("layer %d (%s): blob has sha256:%s: the source is corrupt", i, name, got)
		}
	}
	return ur.n, ctx.Err()
}

// countingReader hashes and counts what passes through it.
type countingReader struct {
	r   io.Reader
	h   hash.Hash
	n   int64
	add func(int64)
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.h.Write(p[:n])
		c.n += int64(n)
		if c.add != nil {
			c.add(int64(n))
		}
	}
	return n, err
}

// envObject renders a config Env list as an ordered JSON object.
func envObject(env []string) json.RawMessage {
	var keys []string
	vals := map[string]string{}
	for _, e := range env {
		k, v, _ := strings.Cut(e, "=")
		if _, ok := vals[k]; !ok {
			keys = append(keys, k)
		}
		vals[k] = v
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		vb, _ := json.Marshal(vals[k])
		b.Write(kb)
		b.WriteByte(':')
		b.Write(vb)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// lockFile takes an exclusive flock on p, waiting (and saying so) while
// another process holds it. The lock dies with its process, so a killed
// importer never leaves it held.
func lockFile(ctx context.Context, p string, log *slog.Logger, image string) (func(), error) {
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %q: %w", p, err)
	}
	for waited := false; ; waited = true {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if err != unix.EWOULDBLOCK {
			f.Close()
			return nil, fmt.Errorf("lock %q: %w", p, err)
		}
		if !waited {
			log.Info("another import of this image is running; waiting for it", "image", image, "lock", p)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// tryLock takes the lock only if it is free.
func tryLock(p string) (func(), bool) {
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, false
	}
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		f.Close()
		return nil, false
	}
	return func() { f.Close() }, true
}

func syncfs(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

// removeTree removes a directory tree without following links, also when
// rootless directory modes forbid it.
func removeTree(p string) error {
	dfd, err := unix.Open(filepath.Dir(p), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	defer unix.Close(dfd)
	return removeAt(dfd, filepath.Base(p))
}

// readAhead reads its source to the end in a goroutine, in 1 MiB chunks,
// up to 4 chunks ahead of the consumer; then it runs finish. Read returns
// io.EOF at the end of the source, also when the source failed: Close
// (which stops the goroutine) returns that failure.
type readAhead struct {
	ch   chan []byte
	free chan []byte
	done chan struct{}
	res  chan error
	cur  []byte
	buf  []byte
	err  error
	shut bool
}

func newReadAhead(src io.Reader, finish func() error) *readAhead {
	const chunks = 4
	ra := &readAhead{ch: make(chan []byte, chunks), free: make(chan []byte, chunks), done: make(chan struct{}), res: make(chan error, 1)}
	for range chunks {
		ra.free <- make([]byte, 1<<20)
	}
	go func() {
		defer close(ra.ch)
		for {
			var b []byte
			select {
			case b = <-ra.free:
			case <-ra.done:
				ra.res <- nil
				return
			}
			n, err := io.ReadFull(src, b)
			if n > 0 {
				select {
				case ra.ch <- b[:n]:
				case <-ra.done:
					ra.res <- nil
					return
				}
			}
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				ra.res <- finish()
				return
			}
			if err != nil {
				ra.res <- err
				return
			}
		}
	}()
	return ra
}

func (r *readAhead) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		if r.buf != nil {
			r.free <- r.buf[:cap(r.buf)]
			r.buf = nil
		}
		b, ok := <-r.ch
		if !ok {
			return 0, io.EOF
		}
		r.buf, r.cur = b, b
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// Close stops the reader and returns the source's error, if any.
func (r *readAhead) Close() error {
	if !r.shut {
		r.shut = true
		close(r.done)
		r.err = <-r.res
	}
	return r.err
}
