package images

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The layered form's part of the layer writer (unpack.go's package comment
// states the rules): looking paths up in the lowers, and copying up from
// them what this layer needs.

// overlayOpaque is the xattr overlayfs reads as "this directory hides the
// lower directories of its name".
const overlayOpaque = "trusted.overlay.opaque"

// isWhiteout reports whether st is overlayfs's whiteout (a 0/0 character
// device).
func isWhiteout(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 }

// overlayXattr reports whether an xattr name is in a namespace overlayfs
// (kernel or fuse-overlayfs) interprets.
func overlayXattr(name string) bool {
	return strings.HasPrefix(name, "trusted.overlay.") || strings.HasPrefix(name, "user.overlay.") ||
		strings.HasPrefix(name, "user.fuseoverlayfs.")
}

// checkXattrs refuses, in the layered form, the xattrs that would steer the
// overlay mount (an opaque marker, a redirect).
func (u *unpacker) checkXattrs(xs map[string]string) error {
	if !u.layered {
		return nil
	}
	for k := range xs {
		if overlayXattr(k) {
			return fmt.Errorf("xattr %s is in overlayfs's own namespace, which a layer may not set: %w", k, errUnsafe)
		}
	}
	return nil
}

// lookupLower finds rel (non-empty) in the merged view of the lowers: the
// index of the topmost lower that holds it and its lstat. Whiteouts and
// opaque directories hide what is below them. A prefix of rel that is a
// symlink is ELOOP and one that is another non-directory ENOTDIR, as
// resolving it in a whole rootfs would be.
func (u *unpacker) lookupLower(rel string) (layer int, st unix.Stat_t, found bool, err error) {
	comps := strings.Split(rel, "/")
	for li, lfd := range u.lowers {
		cur, stop := lfd, false
		for j, c := range comps {
			var s unix.Stat_t
			if e := unix.Fstatat(cur, c, &s, unix.AT_SYMLINK_NOFOLLOW); e != nil {
				if e != unix.ENOENT {
					err = e
				}
				break
			}
			if isWhiteout(&s) {
				stop = true
				break
			}
			if j == len(comps)-1 {
				st, found, layer = s, true, li
				break
			}
			switch s.Mode & unix.S_IFMT {
			case unix.S_IFDIR:
			case unix.S_IFLNK:
				err = unix.ELOOP
			default:
				err = unix.ENOTDIR
			}
			if err != nil {
				break
			}
			nfd, e := resolveBeneath(cur, c)
			if cur != lfd {
				unix.Close(cur)
			}
			cur = nfd
			if e != nil {
				cur, err = lfd, e
				break
			}
			if opaqueDir(cur) {
				stop = true
			}
		}
		if cur != lfd {
			unix.Close(cur)
		}
		if err != nil || found || stop {
			return layer, st, found, err
		}
	}
	return 0, st, false, nil
}

// opaqueDir reports whether the directory of an O_PATH fd is opaque.
func opaqueDir(fd int) bool {
	var b [4]byte
	n, err := unix.Getxattr(fmt.Sprintf("/proc/self/fd/%d", fd), overlayOpaque, b[:])
	return err == nil && n == 1 && b[0] == 'y'
}

// markOpaque makes directory base of pfd opaque (layered form with lowers
// only: with none there is nothing to hide).
func (u *unpacker) markOpaque(pfd int, base, name string) error {
	if len(u.lowers) == 0 {
		return nil
	}
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opaque directory %q: %w", name, err)
	}
	defer unix.Close(fd)
	if err := unix.Fsetxattr(fd, overlayOpaque, []byte("y"), 0); err != nil {
		return fmt.Errorf("opaque directory %q: %w (the layered form needs root and a filesystem with trusted xattrs)", name, err)
	}
	return nil
}

// copyUpDir gives directory c of fd (path name, just made by mkdirs with
// mode 0755) the metadata of the lowers' directory of that name, if they
// have one: a layer that writes below a directory without listing it
// leaves it as it was. copied is false when no lower has it.
func (u *unpacker) copyUpDir(fd int, c, name string) (copied bool, err error) {
	if len(u.lowers) == 0 {
		return false, nil
	}
	li, st, found, err := u.lookupLower(name)
	if err != nil || !found {
		return false, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
	case unix.S_IFLNK:
		return false, unix.ELOOP
	default:
		return false, unix.ENOTDIR
	}
	src, err := resolveBeneath(u.lowers[li], name)
	if err != nil {
		return false, err
	}
	defer unix.Close(src)
	if err := u.copyMeta(fd, c, fmt.Sprintf("/proc/self/fd/%d", src), &st, true); err != nil {
		return false, fmt.Errorf("copy up directory %q: %w", name, err)
	}
	u.dirs[name] = dirMeta{mode: uint32(st.Mode) & 0o7777, atime: st.Atim, mtime: st.Mtim}
	return true, nil
}

// copyUpRoot gives this layer's root the top lower's root metadata (a "./"
// entry of the layer then overrides it).
func (u *unpacker) copyUpRoot() error {
	if len(u.lowers) == 0 {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(u.lowers[0], &st); err != nil {
		return err
	}
	if err := u.copyMeta(u.root, ".", fmt.Sprintf("/proc/self/fd/%d", u.lowers[0]), &st, true); err != nil {
		return fmt.Errorf("copy up the root: %w", err)
	}
	u.dirs[""] = dirMeta{mode: uint32(st.Mode) & 0o7777, atime: st.Atim, mtime: st.Mtim}
	return nil
}

// copyMeta applies st's owner and mode and src's xattrs (bar overlayfs's
// own) to base of pfd; times are left to the caller.
func (u *unpacker) copyMeta(pfd int, base, src string, st *unix.Stat_t, chmod bool) error {
	if !u.rootless {
		if err := unix.Fchownat(pfd, base, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chown: %w", err)
		}
	}
	if chmod {
		if err := unix.Fchmodat(pfd, base, uint32(st.Mode)&0o7777, 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return nil
	}
	names := make([]byte, 64<<10)
	n, err := unix.Llistxattr(src, names)
	if err != nil || n == 0 {
		return nil
	}
	dst := fmt.Sprintf("/proc/self/fd/%d", pfd)
	if base != "." {
		fd, err := unix.Openat(pfd, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		dst = fmt.Sprintf("/proc/self/fd/%d", fd)
	}
	val := make([]byte, 64<<10)
	for _, k := range strings.Split(string(names[:n]), "\x00") {
		if k == "" || overlayXattr(k) {
			continue
		}
		m, err := unix.Lgetxattr(src, k, val)
		if err != nil {
			continue
		}
		if err := unix.Lsetxattr(dst, k, val[:m], 0); err != nil {
			if err := u.xattrFailed(k, err); err != nil {
				return err
			}
		}
	}
	return nil
}

// copyUpLink makes the target of a hard link present in this layer when
// only a lower has it: the file is copied up with every name of it that
// the lower holds and the merged view still shows, so the link joins the
// same group of names it joins in a whole rootfs. copied is false when
// nothing was copied (the target is here already, or nowhere).
func (u *unpacker) copyUpLink(target string) (copied bool, err error) {
	if u.present(target) {
		return false, nil
	}
	li, st, found, err := u.lookupLower(target)
	if err != nil {
		return false, pathError(target, err)
	}
	if !found || st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return false, nil
	}
	if err := u.copyNode(li, target); err != nil {
		return false, err
	}
	if st.Nlink < 2 {
		return true, nil
	}
	// Every other visible name of the same lower inode links the copy.
	var others []string
	err = filepath.WalkDir(u.lowerPaths[li], func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !d.Type().IsRegular() && d.Type()&fs.ModeSymlink == 0 {
			return err
		}
		var s unix.Stat_t
		if unix.Lstat(p, &s) == nil && s.Ino == st.Ino && s.Dev == st.Dev {
			rel, _ := filepath.Rel(u.lowerPaths[li], p)
			if rel != target {
				others = append(others, filepath.ToSlash(rel))
			}
		}
		return nil
	})
	if err != nil {
		return true, fmt.Errorf("copy up the names of %q: %w", target, err)
	}
	for _, o := range others {
		if u.present(o) {
			continue // this layer's own entry hides it
		}
		oli, ost, ok, err := u.lookupLower(o)
		if err != nil || !ok || oli != li || ost.Ino != st.Ino {
			continue // hidden by a layer between
		}
		if err := u.linkCopy(target, o); err != nil {
			return true, err
		}
	}
	return true, nil
}

// present reports whether rel is in this layer's directory (a whiteout
// counts: it hides the lowers' name).
func (u *unpacker) present(rel string) bool {
	dir, base := splitName(rel)
	pfd := u.root
	if dir != "" {
		fd, err := resolveBeneath(u.root, dir)
		if err != nil {
			return false
		}
		defer unix.Close(fd)
		pfd = fd
	}
	var st unix.Stat_t
	return unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
}

// copyNode copies the non-directory rel of lower li into this layer
// (parents copied up first), with owner, mode, xattrs and times.
func (u *unpacker) copyNode(li int, rel string) error {
	dir, base := splitName(rel)
	spfd := u.lowers[li]
	if dir != "" {
		fd, err := resolveBeneath(spfd, dir)
		if err != nil {
			return pathError(dir, err)
		}
		defer unix.Close(fd)
		spfd = fd
	}
	var st unix.Stat_t
	if err := unix.Fstatat(spfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("copy up %q: %w", rel, err)
	}
	pfd, err := u.parent(dir, true)
	if err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		in, err := unix.Openat(spfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("copy up %q: %w", rel, err)
		}
		inf := os.NewFile(uintptr(in), rel)
		defer inf.Close()
		out, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("copy up %q: %w", rel, err)
		}
		outf := os.NewFile(uintptr(out), rel)
		_, err = io.CopyBuffer(struct{ io.Writer }{outf}, inf, u.buf)
		outf.Close()
		if err != nil {
			return fmt.Errorf("copy up %q: %w", rel, err)
		}
	case unix.S_IFLNK:
		buf := make([]byte, 4096)
		n, err := unix.Readlinkat(spfd, base, buf)
		if err != nil {
			return fmt.Errorf("copy up %q: %w", rel, err)
		}
		if err := unix.Symlinkat(string(buf[:n]), pfd, base); err != nil {
			return fmt.Errorf("copy up %q: %w", rel, err)
		}
	case unix.S_IFIFO:
		if err := unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0); err != nil {
			return fmt.Errorf("copy up %q: %w", rel, err)
		}
	default:
		return fmt.Errorf("copy up %q: unexpected file type %o", rel, st.Mode&unix.S_IFMT)
	}
	src := fmt.Sprintf("/proc/self/fd/%d/%s", spfd, base)
	if err := u.copyMeta(pfd, base, src, &st, st.Mode&unix.S_IFMT != unix.S_IFLNK); err != nil {
		return fmt.Errorf("copy up %q: %w", rel, err)
	}
	if err := unix.UtimesNanoAt(pfd, base, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("copy up %q: utimes: %w", rel, err)
	}
	return nil
}

// linkCopy links name to the copied-up target (both in this layer).
func (u *unpacker) linkCopy(target, name string) error {
	tdir, tbase := splitName(target)
	tfd := u.root
	if tdir != "" {
		fd, err := resolveBeneath(u.root, tdir)
		if err != nil {
			return pathError(tdir, err)
		}
		defer unix.Close(fd)
		tfd = fd
	}
	dir, base := splitName(name)
	pfd, err := u.parent(dir, true)
	if err != nil {
		return err
	}
	if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("copy up %q: link to %q: %w", name, target, err)
	}
	return nil
}
