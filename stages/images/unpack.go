package images

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kilnrl/kiln/internal/stagecmd"
)

// The layer writer. It applies OCI layer tars to a root filesystem with
// these guarantees, which are the reason it exists instead of a plain tar
// walk:
//
//   - Nothing outside the rootfs is ever created, changed or removed.
//     Every path is resolved relative to a directory fd of the rootfs with
//     openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), so neither ".." nor a
//     symlink (planted by this layer or an earlier one) is followed while
//     extracting; final components are created with *at calls on that
//     parent fd and never followed (O_NOFOLLOW, AT_SYMLINK_NOFOLLOW).
//   - An entry that would need to follow a link or leave the root is an
//     error naming the layer and the entry, never silently clamped: a name
//     with a ".." component, a write through a symlinked directory, a hard
//     link whose target is outside or behind a symlink, a whiteout of "."
//     or "..". Absolute names are taken relative to the rootfs, as tar
//     does. Symlink targets are data: they are stored verbatim (an absolute
//     target means the container's root, and kiln never follows them).
//   - OCI whiteouts (".wh.NAME") and opaque directories (".wh..wh..opq")
//     hide only what earlier layers wrote, as the image spec says.
//   - Owners are applied when running as root, skipped otherwise
//     (rootless); modes (with setuid/setgid/sticky bits), mtimes and
//     xattrs are applied; directory modes and times are applied after the
//     last layer so later entries cannot disturb them. Device nodes are
//     skipped with a note (sandboxes bind /dev); FIFOs are created.
//
// In the layered form (docs/data-and-grading.md §2.4) each layer is
// written into its own directory, in overlayfs's form, over the
// directories of the layers below it (the lowers, read only here):
//
//   - A whiteout of a name is a 0/0 character device, an opaque directory
//     carries trusted.overlay.opaque=y; a directory made where this layer
//     removed something (a whiteout, a file) is opaque too, so it hides the
//     lower directory of that name as the whole-rootfs writer's removal did.
//   - A directory this layer writes below without listing it, and the
//     target of a hard link to a lower file, are copied up from the lowers
//     (metadata; the file with every visible name of it in that lower), as
//     overlayfs does when a path is written, so the merged view is what the
//     whole-rootfs writer makes.
//   - The lowers are read with the same rules: a path that passes through a
//     symlink of a lower layer is refused as one of this layer would be.
//   - xattrs of overlayfs's own namespaces (trusted.overlay.*,
//     user.overlay.*) in a layer tar are refused: they would steer the
//     overlay mount.

// EntryError is a layer entry that could not be applied.
type EntryError struct {
	Layer  int    // 0-based index in the manifest
	Digest string // the layer's (compressed) digest
	Entry  string // the tar entry name as written
	Err    error
}

func (e *EntryError) Error() string {
	return fmt.Sprintf("layer %d (%s): entry %q: %v", e.Layer, e.Digest, e.Entry, e.Err)
}

func (e *EntryError) Unwrap() error { return e.Err }

// errUnsafe marks entries refused because applying them could reach
// outside the rootfs. It is invalid input (exit 5): retrying cannot help.
var errUnsafe error = stagecmd.BadInputError{Err: errors.New("unsafe layer entry")}

const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// dirMeta is a directory's metadata, applied after the last layer.
type dirMeta struct {
	mode  uint32
	atime unix.Timespec
	mtime unix.Timespec
}

// unpacker applies layers to one rootfs.
type unpacker struct {
	root     int  // O_PATH fd of the rootfs
	rootless bool // do not chown
	// upper holds the paths this layer wrote (and their implicit parents):
	// whiteouts and opaque markers never remove them.
	upper map[string]struct{}
	// dirs is the final metadata of every directory an entry described.
	dirs map[string]dirMeta
	// one-entry cache of the last parent directory fd: tar streams list a
	// directory's entries together, so this saves most path resolutions.
	cacheDir string
	cacheFd  int
	buf      []byte
	// notes is every note, for image.json; noteCounts counts them by kind
	// for the one-line summary an import logs.
	notes      []string
	noteCounts map[noteKind]int
	entries    int64
	// layered: write the layered form (see the package comment above);
	// lowers are the O_PATH fds of the layer directories below, top first
	// (owned by the caller), empty for the bottom layer or a flattened group.
	layered    bool
	lowers     []int
	lowerPaths []string
}

// noteKind is what a note is about, in the order the summary lists them.
type noteKind int

const (
	noteDeviceNode noteKind = iota // a device node was skipped
	noteXattr                      // an xattr could not be set
	noteKinds
)

// note records a note of kind k.
func (u *unpacker) note(k noteKind, format string, args ...any) {
	u.notes = append(u.notes, fmt.Sprintf(format, args...))
	if u.noteCounts == nil {
		u.noteCounts = map[noteKind]int{}
	}
	u.noteCounts[k]++
}

// summarizeNotes is the one-line summary of an image's notes by kind, such
// as "16 device nodes skipped, 1 xattr not applied" ("" for none). The
// notes themselves are too many to log (every device node of a base
// image); image.json lists them all.
func summarizeNotes(counts map[noteKind]int) string {
	phrases := [noteKinds][2]string{
		noteDeviceNode: {"device node skipped", "device nodes skipped"},
		noteXattr:      {"xattr not applied", "xattrs not applied"},
	}
	var parts []string
	for k := range noteKinds {
		switch n := counts[k]; n {
		case 0:
		case 1:
			parts = append(parts, "1 "+phrases[k][0])
		default:
			parts = append(parts, fmt.Sprintf("%d %s", n, phrases[k][1]))
		}
	}
	return strings.Join(parts, ", ")
}

func newUnpacker(rootfs string, rootless bool) (*unpacker, error) {
	fd, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open rootfs %q: %w", rootfs, err)
	}
	return &unpacker{root: fd, rootless: rootless, dirs: map[string]dirMeta{}, cacheFd: -1, buf: make([]byte, 1<<20)}, nil
}

// newLayerUnpacker is the writer of one layer (or a flattened group of
// layers) in the layered form, into dir, over the lower layer directories
// lowers (top first).
func newLayerUnpacker(dir string, lowers []string) (*unpacker, error) {
	u, err := newUnpacker(dir, false)
	if err != nil {
		return nil, err
	}
	u.layered = true
	for _, l := range lowers {
		fd, err := unix.Open(l, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			u.close()
			return nil, fmt.Errorf("open lower layer %q: %w", l, err)
		}
		u.lowers, u.lowerPaths = append(u.lowers, fd), append(u.lowerPaths, l)
	}
	if err := u.copyUpRoot(); err != nil {
		u.close()
		return nil, err
	}
	return u, nil
}

func (u *unpacker) close() {
	u.dropCache()
	unix.Close(u.root)
	for _, fd := range u.lowers {
		unix.Close(fd)
	}
	u.lowers = nil
}

func (u *unpacker) dropCache() {
	if u.cacheFd >= 0 {
		unix.Close(u.cacheFd)
	}
	u.cacheFd, u.cacheDir = -1, ""
}

// applyLayer extracts one uncompressed layer tar.
func (u *unpacker) applyLayer(index int, digest string, r io.Reader, onEntry func()) error {
	u.upper = map[string]struct{}{}
	u.dropCache()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			err = fmt.Errorf("layer %d (%s): reading tar: %w", index, digest, err)
			if malformedStream(err) {
				err = stagecmd.BadInputError{Err: err}
			}
			return err
		}
		if err := u.entry(hdr, tr); err != nil {
			return &EntryError{Layer: index, Digest: digest, Entry: hdr.Name, Err: err}
		}
		u.entries++
		if onEntry != nil {
			onEntry()
		}
	}
}

// malformedStream reports whether a layer read failed on its content (a
// bad tar header, a gzip stream that fails its own checks) rather than on
// reading it.
func malformedStream(err error) bool {
	return errors.Is(err, tar.ErrHeader) || errors.Is(err, tar.ErrFieldTooLong) ||
		errors.Is(err, gzip.ErrHeader) || errors.Is(err, gzip.ErrChecksum)
}

// cleanName turns a tar name into a clean path relative to the rootfs
// ("" is the rootfs itself). A ".." component is refused outright: it is
// never needed, and resolving it lexically would ignore symlinks.
func cleanName(name string) (string, error) {
	var parts []string
	for _, c := range strings.Split(name, "/") {
		switch c {
		case "", ".":
		case "..":
			return "", fmt.Errorf("name has a \"..\" component: %w", errUnsafe)
		default:
			parts = append(parts, c)
		}
	}
	return strings.Join(parts, "/"), nil
}

func splitName(p string) (dir, base string) {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i], p[i+1:]
	}
	return "", p
}

func (u *unpacker) markUpper(p string) {
	for {
		u.upper[p] = struct{}{}
		i := strings.LastIndexByte(p, '/')
		if i < 0 {
			return
		}
		p = p[:i]
		if _, ok := u.upper[p]; ok {
			return
		}
	}
}

func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	dir, base := splitName(name)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return u.whiteout(dir, base)
	}
	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader:
		return nil
	case tar.TypeChar, tar.TypeBlock:
		u.note(noteDeviceNode, "skipped device node %q", name)
		return nil
	}
	if name == "" {
		if hdr.Typeflag != tar.TypeDir {
			return stagecmd.BadInputf("the rootfs itself can only be a directory, not type %q", hdr.Typeflag)
		}
		return u.dirEntry(u.root, ".", "", hdr)
	}
	pfd, err := u.parent(dir, true)
	if err != nil {
		return err
	}
	u.markUpper(name)
	switch hdr.Typeflag {
	case tar.TypeDir:
		return u.dirEntry(pfd, base, name, hdr)
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse:
		if err := u.clear(pfd, base, name); err != nil {
			return err
		}
		return u.file(pfd, base, hdr, r)
	case tar.TypeSymlink:
		if err := u.clear(pfd, base, name); err != nil {
			return err
		}
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return fmt.Errorf("symlink: %w", err)
		}
		return u.meta(pfd, base, hdr, false)
	case tar.TypeLink:
		return u.hardlink(pfd, base, name, hdr)
	case tar.TypeFifo:
		if err := u.clear(pfd, base, name); err != nil {
			return err
		}
		if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
			return fmt.Errorf("mkfifo: %w", err)
		}
		return u.meta(pfd, base, hdr, true)
	}
	return stagecmd.BadInputf("unsupported tar entry type %q", hdr.Typeflag)
}

// parent returns an O_PATH fd of directory dir (relative to the rootfs),
// creating missing directories (mode 0755, as umoci does) when create is
// set. The fd belongs to the cache; callers must not close it.
func (u *unpacker) parent(dir string, create bool) (int, error) {
	if dir == "" {
		return u.root, nil
	}
	if u.cacheFd >= 0 && u.cacheDir == dir {
		return u.cacheFd, nil
	}
	fd, err := resolveBeneath(u.root, dir)
	if errors.Is(err, unix.ENOENT) && create {
		fd, err = u.mkdirs(dir)
	}
	if err != nil {
		return -1, pathError(dir, err)
	}
	u.dropCache()
	u.cacheDir, u.cacheFd = dir, fd
	return fd, nil
}

// resolveBeneath opens rel below dirfd without following any symlink or
// leaving dirfd.
func resolveBeneath(dirfd int, rel string) (int, error) {
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	for {
		fd, err := unix.Openat2(dirfd, rel, &how)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		return fd, err
	}
}

func pathError(p string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("directory %q is or passes through a symlink; kiln never follows links while extracting: %w", p, errUnsafe)
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("directory %q leads outside the rootfs: %w", p, errUnsafe)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("directory %q: a component is not a directory: %w", p, err)
	}
	return fmt.Errorf("directory %q: %w", p, err)
}

func (u *unpacker) mkdirs(dir string) (int, error) {
	fd := u.root
	done := ""
	for _, c := range strings.Split(dir, "/") {
		if done == "" {
			done = c
		} else {
			done += "/" + c
		}
		err := unix.Mkdirat(fd, c, 0o755)
		if err == nil {
			if err := unix.Fchmodat(fd, c, 0o755, 0); err != nil {
				return -1, err
			}
			if copied, err := u.copyUpDir(fd, c, done); err != nil {
				return -1, err
			} else if !copied {
				u.markUpper(done)
			}
		} else if err != unix.EEXIST {
			return -1, err
		}
		nfd, err := resolveBeneath(fd, c)
		if fd != u.root {
			unix.Close(fd)
		}
		if err != nil {
			return -1, err
		}
		fd = nfd
	}
	return fd, nil
}

// clear removes whatever is at base (a directory with its contents), so a
// new non-directory entry replaces it and never writes through it.
func (u *unpacker) clear(pfd int, base, name string) error {
	err := unix.Unlinkat(pfd, base, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err == unix.EISDIR {
		return u.removeDir(pfd, base, name)
	}
	return fmt.Errorf("replace %q: %w", name, err)
}

// removeDir removes directory base of pfd and everything below it, never
// following links.
func (u *unpacker) removeDir(pfd int, base, name string) error {
	if u.cacheDir == name || strings.HasPrefix(u.cacheDir, name+"/") {
		u.dropCache() // never pfd: that is name's parent
	}
	for p := range u.dirs {
		if p == name || strings.HasPrefix(p, name+"/") {
			delete(u.dirs, p)
		}
	}
	if err := removeAt(pfd, base); err != nil {
		return fmt.Errorf("remove %q: %w", name, err)
	}
	return nil
}

func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	unix.Fchmod(fd, 0o700) // rootless: make its entries removable
	f := os.NewFile(uintptr(fd), name)
	names, err := f.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = removeAt(fd, n); err != nil {
				break
			}
		}
	}
	f.Close()
	if err != nil {
		return err
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

func (u *unpacker) whiteout(dir, base string) error {
	pfd, err := u.parent(dir, false)
	if (errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR)) && len(u.lowers) > 0 && dir != "" {
		// Not in this layer's directory: hide what the lowers have there
		// (copying the directory up), or nothing if they have none.
		_, st, found, lerr := u.lookupLower(dir)
		switch {
		case lerr != nil:
			if errors.Is(lerr, unix.ENOTDIR) {
				return nil
			}
			return pathError(dir, lerr)
		case found && st.Mode&unix.S_IFMT == unix.S_IFDIR:
			pfd, err = u.parent(dir, true)
		case found && st.Mode&unix.S_IFMT == unix.S_IFLNK:
			return pathError(dir, unix.ELOOP) // as the whole-rootfs writer refuses it
		}
	}
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil // nothing below to hide
	}
	if err != nil {
		return err
	}
	if base == whiteoutOpaque {
		if err := u.opaque(pfd, dir); err != nil {
			return err
		}
		return u.markOpaque(pfd, ".", dir)
	}
	target := strings.TrimPrefix(base, whiteoutPrefix)
	if target == "" || target == "." || target == ".." {
		return fmt.Errorf("whiteout of %q: %w", target, errUnsafe)
	}
	name := path.Join(dir, target)
	if _, ok := u.upper[name]; ok {
		return nil // a whiteout hides lower layers only
	}
	if err := u.clear(pfd, target, name); err != nil {
		return err
	}
	if len(u.lowers) > 0 {
		// overlayfs's whiteout: a 0/0 character device. Made whether or not
		// a lower has the name (one that has none hides nothing).
		if err := unix.Mknodat(pfd, target, unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("whiteout of %q: mknod: %w", name, err)
		}
	}
	return nil
}

// opaque removes what earlier layers put below dir, keeping what this
// layer wrote there.
func (u *unpacker) opaque(pfd int, dir string) error {
	fd, err := unix.Openat(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opaque directory %q: %w", dir, err)
	}
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("opaque directory %q: %w", dir, err)
	}
	for _, n := range names {
		name := path.Join(dir, n)
		if _, ok := u.upper[name]; !ok {
			if err := u.clear(fd, n, name); err != nil {
				return err
			}
			continue
		}
		// Written by this layer: if it is a directory that existed below,
		// its lower contents are hidden too.
		var st unix.Stat_t
		if unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			cfd, err := resolveBeneath(fd, n)
			if err != nil {
				return pathError(name, err)
			}
			err = u.opaque(cfd, name)
			unix.Close(cfd)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func (u *unpacker) dirEntry(pfd int, base, name string, hdr *tar.Header) error {
	var st unix.Stat_t
	err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
	case err == nil || err == unix.ENOENT:
		replaced := err == nil
		if replaced {
			if err := u.clear(pfd, base, name); err != nil {
				return err
			}
		}
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			return fmt.Errorf("mkdir: %w", err)
		}
		if replaced {
			// What this directory replaced hid the lowers' directory of
			// that name; the new one must go on hiding it.
			if err := u.markOpaque(pfd, base, name); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("stat: %w", err)
	}
	if !u.rootless {
		if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	mode := tarMode(hdr)
	if u.rootless {
		mode |= 0o700 // until the end, so later entries can be written below it
	}
	if err := unix.Fchmodat(pfd, base, mode, 0); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	if err := u.xattrsAt(pfd, base, hdr); err != nil {
		return err
	}
	u.dirs[name] = dirMeta{mode: tarMode(hdr), atime: ts(hdr.AccessTime, hdr.ModTime), mtime: ts(hdr.ModTime, hdr.ModTime)}
	return nil
}

func (u *unpacker) file(pfd int, base string, hdr *tar.Header, r io.Reader) error {
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	f := os.NewFile(uintptr(fd), base)
	defer f.Close()
	// A plain io.Writer, so the copy uses our 1 MiB buffer rather than
	// os.File.ReadFrom's 32 KiB one.
	if _, err := io.CopyBuffer(struct{ io.Writer }{f}, r, u.buf); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if !u.rootless {
		if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	if err := unix.Fchmod(fd, tarMode(hdr)); err != nil { // after chown, which clears setuid
		return fmt.Errorf("chmod: %w", err)
	}
	if err := u.checkXattrs(xattrs(hdr)); err != nil {
		return err
	}
	for k, v := range xattrs(hdr) {
		if err := unix.Fsetxattr(fd, k, []byte(v), 0); err != nil {
			if err := u.xattrFailed(k, err); err != nil {
				return err
			}
		}
	}
	times := []unix.Timespec{ts(hdr.AccessTime, hdr.ModTime), ts(hdr.ModTime, hdr.ModTime)}
	if err := unix.UtimesNanoAt(pfd, base, times, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("utimes: %w", err)
	}
	return nil
}

func (u *unpacker) hardlink(pfd int, base, name string, hdr *tar.Header) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
	}
	if target == "" || target == name {
		return fmt.Errorf("hard link to %q: not a file", hdr.Linkname)
	}
	tdir, tbase := splitName(target)
	if len(u.lowers) > 0 {
		copied, err := u.copyUpLink(target)
		if err != nil {
			return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
		}
		if copied { // the copy-up moved the parent cache: name's parent again
			dir, _ := splitName(name)
			if pfd, err = u.parent(dir, true); err != nil {
				return err
			}
		}
	}
	// The target's parent must be reachable without following links; use
	// a separate fd so the cached parent stays valid.
	tfd := u.root
	if tdir != "" {
		if tfd, err = resolveBeneath(u.root, tdir); err != nil {
			return fmt.Errorf("hard link target %q: %w", hdr.Linkname, pathError(tdir, err))
		}
		defer unix.Close(tfd)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(tfd, tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return fmt.Errorf("hard link target %q is a directory", hdr.Linkname)
	}
	if err := u.clear(pfd, base, name); err != nil {
		return err
	}
	// Flags 0: the link names the target itself, even if it is a symlink.
	if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil {
		return fmt.Errorf("hard link to %q: %w", hdr.Linkname, err)
	}
	return nil
}

// meta applies owner, mode (unless a symlink) and times to base.
func (u *unpacker) meta(pfd int, base string, hdr *tar.Header, chmod bool) error {
	if !u.rootless {
		if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	if chmod {
		if err := unix.Fchmodat(pfd, base, tarMode(hdr), 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	times := []unix.Timespec{ts(hdr.AccessTime, hdr.ModTime), ts(hdr.ModTime, hdr.ModTime)}
	if err := unix.UtimesNanoAt(pfd, base, times, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("utimes: %w", err)
	}
	return nil
}

func (u *unpacker) xattrsAt(pfd int, base string, hdr *tar.Header) error {
	xs := xattrs(hdr)
	if len(xs) == 0 {
		return nil
	}
	if err := u.checkXattrs(xs); err != nil {
		return err
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("xattrs: %w", err)
	}
	defer unix.Close(fd)
	for k, v := range xs {
		if err := unix.Fsetxattr(fd, k, []byte(v), 0); err != nil {
			if err := u.xattrFailed(k, err); err != nil {
				return err
			}
		}
	}
	return nil
}

// xattrFailed decides whether a failed setxattr is fatal: a filesystem
// without xattrs, or a privileged namespace when rootless, is a note.
func (u *unpacker) xattrFailed(key string, err error) error {
	if errors.Is(err, unix.ENOTSUP) || (u.rootless && errors.Is(err, unix.EPERM)) {
		u.note(noteXattr, "xattr %s not applied: %v", key, err)
		return nil
	}
	return fmt.Errorf("xattr %s: %w", key, err)
}

// finish applies directory modes and times, deepest first, so setting a
// directory's time is never undone by work in it.
func (u *unpacker) finish() error {
	u.dropCache()
	names := make([]string, 0, len(u.dirs))
	for p := range u.dirs {
		names = append(names, p)
	}
	sort.Slice(names, func(i, j int) bool { return names[i] > names[j] })
	for _, p := range names {
		m := u.dirs[p]
		dir, base := splitName(p)
		pfd := u.root
		if p == "" {
			base = "."
		} else if dir != "" {
			fd, err := resolveBeneath(u.root, dir)
			if err != nil {
				return pathError(dir, err)
			}
			pfd = fd
		}
		err := unix.Fchmodat(pfd, base, m.mode, 0)
		if err == nil {
			err = unix.UtimesNanoAt(pfd, base, []unix.Timespec{m.atime, m.mtime}, unix.AT_SYMLINK_NOFOLLOW)
		}
		if pfd != u.root {
			unix.Close(pfd)
		}
		if err != nil {
			return fmt.Errorf("directory %q: %w", p, err)
		}
	}
	return nil
}

func tarMode(hdr *tar.Header) uint32 { return uint32(hdr.Mode) & 0o7777 }

func xattrs(hdr *tar.Header) map[string]string {
	var out map[string]string
	for k, v := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
			if out == nil {
				out = map[string]string{}
			}
			out[name] = v
		}
	}
	return out
}

// ts converts a tar time; a zero time falls back to def (then the epoch).
func ts(t, def time.Time) unix.Timespec {
	if t.IsZero() {
		t = def
	}
	if t.IsZero() {
		return unix.Timespec{}
	}
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}
