package sandboxinit

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// user is an /etc/passwd entry with its groups.
type user struct {
	name, home, shell string
	uid, gid          uint32
	groups            []uint32
}

func (u *user) env() []string {
	return []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + u.home, "USER=" + u.name, "LOGNAME=" + u.name, "SHELL=" + u.shell,
	}
}

// lookupUser reads the sandbox's own /etc/passwd and /etc/group (the helper
// must not use os/user, see the package comment).
func lookupUser(name string) (*user, error) {
	if name == "" {
		name = "root"
	}
	var u *user
	err := eachLine("/etc/passwd", func(f []string) bool {
		if len(f) < 7 || f[0] != name {
			return true
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return true
		}
		u = &user{name: name, uid: uint32(uid), gid: uint32(gid), home: f[5], shell: f[6]}
		return false
	})
	if err != nil {
		return nil, err
	}
	if u == nil {
		return nil, fmt.Errorf("unknown user %q: not in the sandbox's /etc/passwd", name)
	}
	u.groups = []uint32{u.gid}
	_ = eachLine("/etc/group", func(f []string) bool {
		if len(f) < 4 {
			return true
		}
		for _, m := range strings.Split(f[3], ",") {
			if m == name {
				if gid, err := strconv.ParseUint(f[2], 10, 32); err == nil && uint32(gid) != u.gid {
					u.groups = append(u.groups, uint32(gid))
				}
			}
		}
		return true
	})
	return u, nil
}

// eachLine calls fn with the colon-separated fields of every line of path
// until fn returns false.
func eachLine(path string, fn func([]string) bool) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if !fn(strings.Split(sc.Text(), ":")) {
			break
		}
	}
	return nil
}

// ensureUser creates name as an unprivileged user (uid and gid >= 1000, home
// /home/NAME owned by it, shell bash) unless it exists; it only makes sure
// the home directory exists for an existing user.
func ensureUser(name string) error {
	if u, err := lookupUser(name); err == nil {
		return ensureHome(u)
	}
	used := map[string]map[uint64]bool{"/etc/passwd": {}, "/etc/group": {}}
	groupGID := int64(-1)
	for path, ids := range used {
		_ = eachLine(path, func(f []string) bool {
			if len(f) >= 3 {
				if id, err := strconv.ParseUint(f[2], 10, 32); err == nil {
					ids[id] = true
					if path == "/etc/group" && f[0] == name {
						groupGID = int64(id)
					}
				}
			}
			return true
		})
	}
	uid := uint64(1000)
	for used["/etc/passwd"][uid] || (groupGID < 0 && used["/etc/group"][uid]) {
		uid++
	}
	gid := uint64(uid)
	if groupGID >= 0 {
		gid = uint64(groupGID)
	}
	shell := "/bin/bash"
	if _, err := os.Stat(shell); err != nil {
		shell = "/bin/sh"
	}
	home := "/home/" + name
	if err := appendLine("/etc/passwd", fmt.Sprintf("%s:x:%d:%d::%s:%s", name, uid, gid, home, shell)); err != nil {
		return err
	}
	if groupGID < 0 {
		if err := appendLine("/etc/group", fmt.Sprintf("%s:x:%d:", name, gid)); err != nil {
			return err
		}
	}
	if _, err := os.Stat("/etc/shadow"); err == nil {
		if err := appendLine("/etc/shadow", name+":!:19000:0:99999:7:::"); err != nil {
			return err
		}
	}
	return ensureHome(&user{name: name, uid: uint32(uid), gid: uint32(gid), home: home})
}

func ensureHome(u *user) error {
	if u.home == "" || u.home == "/" {
		return nil
	}
	if _, err := os.Stat(u.home); err == nil {
		return nil
	}
	if err := os.MkdirAll(u.home, 0o755); err != nil {
		return err
	}
	return os.Chown(u.home, int(u.uid), int(u.gid))
}

// appendLine appends line to path, first ending an unterminated last line.
func appendLine(path, line string) error {
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		line = "\n" + line
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line + "\n"); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
