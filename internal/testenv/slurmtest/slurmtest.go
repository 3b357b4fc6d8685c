// Package slurmtest starts a real one-node Slurm cluster for a test: munged,
// slurmctld and slurmd from Debian's slurm-wlm and munge packages
// (scripts/install-test-deps.sh installs them), on this host, with 2 CPUs, a
// temporary state directory, a slurm.conf written here and free ports. It
// works as root in a container without systemd or cgroups
// (proctrack/linuxproc, task/none). Without the packages, or not as root,
// the test skips, or fails under CI=true (testenv.SkipOrFail).
//
// There is no slurmdbd, so sacct has no accounting to read; MinJobAge is an
// hour so that squeue --states=all and scontrol keep every finished job of
// the test.
package slurmtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kilnrl/kiln/internal/testenv"
)

// Cluster is a running test cluster.
type Cluster struct {
	// Dir holds the configuration, state, logs and the munge socket.
	Dir string
	// Conf is the slurm.conf path; Env sets SLURM_CONF to it.
	Conf string
	// Host is the node's name (this machine's short hostname).
	Host string
	// Partition is the one partition, the default.
	Partition string
	// CPUs is the node's CPU count.
	CPUs int
	// Env is os.Environ() with SLURM_CONF pointing at Conf: the environment
	// for sbatch, squeue and the other client commands.
	Env []string
	// Started is how long the start took (munged to sinfo "idle").
	Started time.Duration

	daemons []*exec.Cmd
}

const hint = "install them with scripts/install-test-deps.sh (apt-get install slurm-wlm munge)"

// Start starts a cluster and stops it when the test ends.
func Start(t testing.TB) *Cluster {
	t.Helper()
	bins := map[string]string{}
	for _, name := range []string{"munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel"} {
		p, err := exec.LookPath(name)
		if err != nil {
			for _, dir := range []string{"/usr/sbin", "/usr/bin"} {
				if _, serr := os.Stat(filepath.Join(dir, name)); serr == nil {
					p, err = filepath.Join(dir, name), nil
					break
				}
			}
		}
		if err != nil {
			testenv.SkipOrFail(t, "slurmtest: %s not found: %s", name, hint)
		}
		bins[name] = p
	}
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "slurmtest: slurmd must run as root to start jobs; run the Slurm tests as root")
	}
	begin := time.Now()
	// A short directory: the munge socket path must fit in sun_path.
	dir, err := os.MkdirTemp("", "kiln-slurm-")
	if err != nil {
		t.Fatal(err)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	host, _, _ = strings.Cut(host, ".")
	c := &Cluster{Dir: dir, Conf: filepath.Join(dir, "slurm.conf"), Host: host, Partition: "debug", CPUs: 2}
	t.Cleanup(func() {
		c.stop(t)
		if !t.Failed() {
			os.RemoveAll(dir)
		} else {
			t.Logf("slurmtest: cluster files kept in %s", dir)
		}
	})
	for _, sub := range []string{"state", "spool", "log", "munge"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// munged wants its key private and the socket's directory searchable.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 1024)
	rand.Read(key)
	keyFile := filepath.Join(dir, "munge", "munge.key")
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "munge", "sock")
	c.daemon(t, bins["munged"], "-F", "--force", "--key-file="+keyFile, "--socket="+sock,
		"--pid-file="+filepath.Join(dir, "munge", "pid"), "--log-file="+filepath.Join(dir, "log", "munged.log"),
		"--seed-file="+filepath.Join(dir, "munge", "seed"))
	waitFor(t, 10*time.Second, "munged socket", func() bool { _, err := os.Stat(sock); return err == nil })

	ports := freePorts(t, 2)
	conf := fmt.Sprintf(slurmConf, host, ports[0], ports[1], sock, dir, c.CPUs, c.Partition, host)
	if err := os.WriteFile(c.Conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Env = append(os.Environ(), "SLURM_CONF="+c.Conf)
	c.daemon(t, bins["slurmctld"], "-D", "-c", "-i", "-f", c.Conf)
	c.daemon(t, bins["slurmd"], "-D", "-f", c.Conf)
	waitFor(t, 30*time.Second, "sinfo to report the node idle", func() bool {
		out, err := c.Command(context.Background(), "sinfo", "-h", "-o", "%T").Output()
		return err == nil && strings.TrimSpace(string(out)) == "idle"
	})
	c.Started = time.Since(begin)
	t.Logf("slurmtest: cluster on %s up in %v (%s)", host, c.Started.Round(time.Millisecond), dir)
	return c
}

// Command is a Slurm client command (sbatch, squeue, ...) on the cluster.
func (c *Cluster) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = c.Env
	return cmd
}

// WaitIdle waits until squeue lists no job, failing the test after limit.
// A pipeline's targets can all be done while jobs that are not targets
// still run: a service's stop job, and the service's own job winding down.
// A test calls it before it returns, so that nothing a job writes lands in a
// directory the test's cleanup is removing.
func (c *Cluster) WaitIdle(t testing.TB, limit time.Duration) {
	t.Helper()
	var last string
	deadline := time.Now().Add(limit)
	for {
		out, err := c.Command(context.Background(), "squeue", "-h", "-o", "%i %j %T").Output()
		last = strings.TrimSpace(string(out))
		if err == nil && last == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("slurmtest: jobs still queued or running after %v (err %v):\n%s", limit, err, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Logs returns the daemons' log files, for a failing test's message.
func (c *Cluster) Logs() string {
	var b strings.Builder
	for _, name := range []string{"slurmctld.log", "slurmd.log"} {
		data, _ := os.ReadFile(filepath.Join(c.Dir, "log", name))
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		fmt.Fprintf(&b, "--- %s (last %d lines)\n%s\n", name, len(lines), strings.Join(lines, "\n"))
	}
	return b.String()
}

// daemon starts a foreground daemon as a child of the test, in its own
// process group so that stop can end it and what it spawned.
func (c *Cluster) daemon(t testing.TB, path string, args ...string) {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+c.Conf)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("slurmtest: starting %s: %v", path, err)
	}
	c.daemons = append(c.daemons, cmd)
}

// stop cancels every job, then ends the daemons in reverse order: SIGTERM,
// and SIGKILL to the process group after 10 s.
func (c *Cluster) stop(t testing.TB) {
	if c.Env != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c.Command(ctx, "scancel", "--full", "--user=root").Run()
		cancel()
	}
	for i := len(c.daemons) - 1; i >= 0; i-- {
		cmd := c.daemons[i]
		pid := cmd.Process.Pid
		syscall.Kill(pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Logf("slurmtest: %s did not stop on SIGTERM; killing it", cmd.Path)
			syscall.Kill(-pid, syscall.SIGKILL)
			<-done
		}
		// Leftovers in the group (slurmstepd of a cancelled job).
		syscall.Kill(-pid, syscall.SIGKILL)
	}
}

func waitFor(t testing.TB, limit time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("slurmtest: timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

// slurmConf is the test cluster's configuration. The scheduler runs on every
// event and without batching delays, so that a dependency chain of short
// jobs runs in seconds.
const slurmConf = `ClusterName=kilntest
SlurmctldHost=%s
SlurmUser=root
SlurmdUser=root
SlurmctldPort=%d
SlurmdPort=%d
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=%[4]s
StateSaveLocation=%[5]s/state
SlurmdSpoolDir=%[5]s/spool
SlurmctldPidFile=%[5]s/slurmctld.pid
SlurmdPidFile=%[5]s/slurmd.pid
SlurmctldLogFile=%[5]s/log/slurmctld.log
SlurmdLogFile=%[5]s/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
MinJobAge=3600
SchedulerType=sched/builtin
SchedulerParameters=sched_min_interval=0,batch_sched_delay=0
MessageTimeout=10
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
Waittime=0
NodeName=%[8]s CPUs=%[6]d State=UNKNOWN
PartitionName=%[7]s Nodes=%[8]s Default=YES MaxTime=INFINITE State=UP
`
