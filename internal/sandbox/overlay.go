package sandbox

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// overlay is the sandbox's copy-on-write root: lower is the image rootfs
// (never written), upper and work live in the sandbox's state directory.
type overlay struct {
	merged string
	fuse   bool
}

// mountOverlay mounts lower+upper at merged with kernel overlayfs, falling
// back to fuse-overlayfs where the kernel refuses (an upper directory that is
// itself on overlayfs, as inside many containers).
func mountOverlay(lower, upper, work, merged string) (*overlay, error) {
	for _, p := range []string{lower, upper, work} {
		if strings.ContainsAny(p, ",:\\") {
			return nil, fmt.Errorf("overlay path %q contains one of , : \\ which overlay options cannot hold; move it", p)
		}
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
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
