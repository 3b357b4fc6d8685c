package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// overlay is the sandbox's copy-on-write root: the lowers are the image's
// layers or its whole rootfs (never written), upper and work live in the
// sandbox's state directory.
type overlay struct {
	merged string
	fuse   bool
}

// maxOverlayOptions bounds the mount option string: the kernel copies it
// into one page.
const maxOverlayOptions = 4000

// LayeredLowers returns the lower directories of rootfs, top first: those
// its bundle's lowers file lists (a layered bundle, docs/data-and-grading.md
// §2.4: BUNDLE/lowers holds one directory per line, bottom first, relative
// to BUNDLE; BUNDLE/rootfs is then an empty placeholder), else rootfs
// itself. Each must be a directory. The lines are resolved from BUNDLE's
// real directory, as ".." would be by the kernel: a bundle reached through
// a symlink (a bundle root of links to another's bundles) still finds the
// layer store beside its real self.
func LayeredLowers(rootfs string) ([]string, error) {
	bundle := filepath.Dir(rootfs)
	b, err := os.ReadFile(filepath.Join(bundle, "lowers"))
	var lowers []string
	switch {
	case err == nil && filepath.Base(rootfs) == "rootfs":
		real, err := filepath.EvalSymlinks(bundle)
		if err != nil {
			return nil, fmt.Errorf("sandbox rootfs %q: %w", rootfs, err)
		}
		bundle = real
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				lowers = append([]string{filepath.Join(bundle, l)}, lowers...)
			}
		}
		if len(lowers) == 0 {
			return nil, fmt.Errorf("sandbox rootfs %q: %s lists no layers; re-import the image (kiln-images import)", rootfs, filepath.Join(bundle, "lowers"))
		}
	case err == nil || errors.Is(err, os.ErrNotExist):
		lowers = []string{rootfs}
	default:
		return nil, fmt.Errorf("sandbox rootfs %q: %w", rootfs, err)
	}
	for _, l := range lowers {
		if fi, err := os.Stat(l); err != nil {
			return nil, fmt.Errorf("sandbox rootfs %q: %w (a layer of the bundle is missing: re-import the image with kiln-images import)", rootfs, err)
		} else if !fi.IsDir() {
			return nil, fmt.Errorf("sandbox rootfs %q: %q is not a directory", rootfs, l)
		}
	}
	return lowers, nil
}

// mountOverlay mounts lowers (top first) + upper at merged with kernel
// overlayfs, falling back to fuse-overlayfs where the kernel refuses (an
// upper directory that is itself on overlayfs, as inside many containers).
func mountOverlay(lowers []string, upper, work, merged string) (*overlay, error) {
	for _, p := range append([]string{upper, work}, lowers...) {
		if strings.ContainsAny(p, ",:\\") {
			return nil, fmt.Errorf("overlay path %q contains one of , : \\ which overlay options cannot hold; move it", p)
		}
	}
	lower := strings.Join(lowers, ":")
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if len(opts)+len(",volatile") > maxOverlayOptions {
		return nil, fmt.Errorf("overlay of %d lowers: the mount options take %d bytes, more than the %d a page allows; re-import the image (kiln-images flattens layers to fit) or use a shorter --bundles path",
			len(lowers), len(opts), maxOverlayOptions)
	}
	// volatile (Linux 5.10+) skips the fsync of every copy-up and syncfs:
	// the upper layer dies with the sandbox anyway, and the syncs are most of
	// a boot's cost (the agent user's copy-ups of /etc/passwd and friends).
	err := syscall.Mount("overlay", merged, "overlay", 0, opts+",volatile")
	if err != nil {
		err = syscall.Mount("overlay", merged, "overlay", 0, opts)
	}
	if err == nil {
		return &overlay{merged: merged}, nil
	}
	ov, ferr := mountFuse(opts, merged)
	if ferr != nil {
		return nil, fmt.Errorf("mount overlay of %q at %q: kernel overlayfs: %w; %w", lower, merged, err, ferr)
	}
	return ov, nil
}

func mountFuse(opts, merged string) (*overlay, error) {
	out, err := exec.Command("fuse-overlayfs", "-o", opts, merged).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("fuse-overlayfs: %w: %s (install fuse-overlayfs)", err, strings.TrimSpace(string(out)))
	}
	return &overlay{merged: merged, fuse: true}, nil
}

// unmount unmounts, falling back to a lazy unmount if something still holds
// the tree after a short wait.
func (o *overlay) unmount() error {
	if o == nil {
		return nil
	}
	if o.fuse {
		out, err := exec.Command("fusermount3", "-u", "-z", o.merged).CombinedOutput()
		if err != nil {
			return fmt.Errorf("unmount %q: %w: %s", o.merged, err, out)
		}
		return nil
	}
	var err error
	for range 50 {
		if err = syscall.Unmount(o.merged, 0); err == nil || errors.Is(err, syscall.EINVAL) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err2 := syscall.Unmount(o.merged, syscall.MNT_DETACH); err2 != nil {
		return fmt.Errorf("unmount %q: %w", o.merged, errors.Join(err, err2))
	}
	return nil
}
