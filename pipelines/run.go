package pipelines

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kilnrl/kiln/formats/dataset"
	"github.com/kilnrl/kiln/formats/store"
)

// RunOptions configure Run.
type RunOptions struct {
	Jobs      int  // parallel targets (default 1)
	KeepGoing bool // run independent targets after a failure
	// Output receives every recipe output line prefixed "[target] ".
	Output io.Writer
	// LockStale is how old an unrefreshed lock must be before another run
	// takes it over (default 2 minutes; the holder refreshes every third).
	LockStale time.Duration
	// OnEvent is called when a target starts ("start") and ends ("done",
	// "failed", "skipped"); nil: ignored.
	OnEvent func(t *Target, event string)
	// NoLock skips the pipeline lock: for one-target runs (--only), which
	// run concurrently as separate Slurm jobs of one submission.
	NoLock bool
	// Shards, when not nil, runs only these shards of a sharded target (a
	// Slurm array task runs its own: kiln run --only T --shard N). Each
	// shard that succeeds is recorded under _pipelines/NAME/shards/KEY/;
	// the target is done when every shard is, all with the same ref (the
	// one version the shards wrote parts of). Nil: every shard.
	Shards []int
}

// Lock is the pipeline's lock object in the store.
type Lock struct {
	Host      string    `json:"host"`
	PID       int       `json:"pid"`
	Time      time.Time `json:"time"`
	Refreshed time.Time `json:"refreshed"`
	// Released: the run that held it has ended and let it go. A run
	// releases its lock by overwriting it with this marker, conditionally
	// on the lock's ETag still being the one it wrote, so that it can never
	// remove a lock another run has taken over (the store has no
	// conditional delete; a released lock is free to take).
	Released bool `json:"released,omitempty"`
}

// ErrLocked: another live run holds the pipeline's lock.
var ErrLocked = errors.New("pipeline is locked by another run")

// ErrLockLost: this run's pipeline lock was taken over by another run (it
// was not refreshed for --lock-stale: the process was stopped, suspended
// or cut off from the store), so this run stopped its targets.
var ErrLockLost = errors.New("this run lost the pipeline lock")

// lock takes the pipeline's lock: absent, released, stale (not written
// for stale by the store's clock) or held by a dead process on this host.
// The lock is refreshed every third of stale while the run goes on. The
// returned context ends, with cause an ErrLockLost error, when the lock is
// lost: a refresh finds another run's lock (a precondition failure), or no
// refresh has succeeded for two thirds of stale (another run may take it
// at stale). release lets the lock go only if it is still this run's.
//
// Staleness is judged by the store's ModTime, the store's own clock, and
// not by the writer's Refreshed time: a lock written by a host whose clock
// runs ahead would otherwise never go stale.
func (p *Plan) lock(ctx context.Context, stale time.Duration) (context.Context, func(), error) {
	st := p.opts.Store
	key := p.rec.prefix + "lock.json"
	host, _ := os.Hostname()
	now := time.Now()
	l := Lock{Host: host, PID: os.Getpid(), Time: now, Refreshed: now}
	enc := func() []byte { b, _ := json.Marshal(l); return b }
	b := enc()
	info, err := st.PutIfAbsent(ctx, key, bytes.NewReader(b), int64(len(b)))
	if errors.Is(err, store.ErrExist) {
		old, oinfo, rerr := store.ReadAll(ctx, st, key)
		if rerr != nil {
			return nil, nil, fmt.Errorf("reading the lock %s in %s: %w", key, st.URI(), rerr)
		}
		var ol Lock
		_ = json.Unmarshal(old, &ol)
		dead := ol.Host == host && ol.PID > 0 && syscall.Kill(ol.PID, 0) == syscall.ESRCH
		age := time.Since(oinfo.ModTime)
		if !ol.Released && !dead && age < stale {
			return nil, nil, fmt.Errorf("%w: %s pid %d since %s (last written %s ago by the store's clock); wait for it, or if it is gone remove %s from %s",
				ErrLocked, ol.Host, ol.PID, ol.Time.UTC().Format(time.RFC3339), age.Round(time.Second), key, st.URI())
		}
		info, err = st.PutIfMatch(ctx, key, bytes.NewReader(b), int64(len(b)), oinfo.ETag)
		if errors.Is(err, store.ErrPrecondition) {
			return nil, nil, fmt.Errorf("%w: another run took the stale lock %s first", ErrLocked, key)
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("taking the lock %s in %s: %w", key, st.URI(), err)
	}
	lctx, cancel := context.WithCancelCause(ctx)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	etag, lost := info.ETag, false
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(max(stale/3, 10*time.Millisecond))
		defer tick.Stop()
		lastOK := time.Now()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			l.Refreshed = time.Now()
			b := enc()
			mu.Lock()
			in, err := st.PutIfMatch(context.WithoutCancel(ctx), key, bytes.NewReader(b), int64(len(b)), etag)
			if err == nil {
				etag, lastOK = in.ETag, time.Now()
				mu.Unlock()
				continue
			}
			var why error
			switch {
			case errors.Is(err, store.ErrPrecondition) || errors.Is(err, store.ErrNotExist):
				holder := "another run"
				if cur, _, rerr := store.ReadAll(context.WithoutCancel(ctx), st, key); rerr == nil {
					var cl Lock
					if json.Unmarshal(cur, &cl) == nil && cl.PID > 0 {
						holder = fmt.Sprintf("%s pid %d", cl.Host, cl.PID)
					}
				}
				why = fmt.Errorf("%w: %s took %s over in %s (this run had not refreshed it for --lock-stale %s: stopped, suspended or cut off from the store); its targets were stopped: let that run finish, then run kiln run again",
					ErrLockLost, holder, key, st.URI(), stale)
			case time.Since(lastOK) >= stale*2/3:
				why = fmt.Errorf("%w: refreshing %s in %s failed for %s, and another run may take it at --lock-stale %s (%v); its targets were stopped: check the store, then run kiln run again",
					ErrLockLost, key, st.URI(), time.Since(lastOK).Round(time.Millisecond), stale, err)
			default:
				p.opts.Log.Warn("refreshing the pipeline lock failed; retrying", "key", key, "err", err)
			}
			if why != nil {
				lost = true
				mu.Unlock()
				p.opts.Log.Error("lost the pipeline lock; stopping every target", "key", key, "err", why)
				cancel(why)
				return
			}
			mu.Unlock()
		}
	}()
	release := func() {
		close(stop)
		wg.Wait()
		cancel(nil)
		mu.Lock()
		defer mu.Unlock()
		if lost {
			return // another run's lock now: not ours to release
		}
		l.Released, l.Refreshed = true, time.Now()
		b := enc()
		if _, err := st.PutIfMatch(context.WithoutCancel(ctx), key, bytes.NewReader(b), int64(len(b)), etag); err != nil {
			p.opts.Log.Warn("releasing the pipeline lock failed (another run may hold it now)", "key", key, "err", err)
		}
	}
	return lctx, release, nil
}

// Only narrows the plan to the one target name (and the services it
// uses): its other prerequisites must be done. This is what a job that
// runs one target with no driver (Slurm) calls: "kiln run FILE --only T".
func (p *Plan) Only(name string) error {
	t := p.byName[name]
	if t == nil {
		return fmt.Errorf("no target %q", name)
	}
	var keep []*Target
	for _, d := range t.Deps {
		dt := p.byName[d]
		if !dt.Service {
			if !dt.Done {
				return fmt.Errorf("--only %s: prerequisite %s is not done (%s): run it first", name, d, dt.Why)
			}
			continue
		}
		keep = append(keep, dt)
		// A service may have to start here (no Slurm companion job runs
		// it): its own prerequisites must be done as well.
		for _, sd := range dt.Deps {
			if sdt := p.byName[sd]; !sdt.Service && !sdt.Done {
				return fmt.Errorf("--only %s: prerequisite %s of its service %s is not done (%s): run it first", name, sd, d, sdt.Why)
			}
		}
	}
	p.Targets = append(keep, t)
	return nil
}

// Result is what Run did.
type Result struct {
	Ran, Failed, Skipped []string
	// Final is the last goal's ref (what kiln run prints last).
	Final string
}

// Run executes the plan's not-done targets in dependency order (see
// pipelines/README.md §5). Each target's recipe runs as one sh -e script
// in the spec file's directory.
func (p *Plan) Run(ctx context.Context, o RunOptions) (*Result, error) {
	if o.Jobs < 1 {
		o.Jobs = 1
	}
	if o.Output == nil {
		o.Output = io.Discard
	}
	if o.LockStale <= 0 {
		o.LockStale = 2 * time.Minute
	}
	if o.OnEvent == nil {
		o.OnEvent = func(*Target, string) {}
	}
	if !o.NoLock {
		lctx, unlock, err := p.lock(ctx, o.LockStale)
		if err != nil {
			return nil, err
		}
		defer unlock()
		// Every target runs under the lock's context: losing the lock
		// cancels them (their process groups are killed).
		ctx = lctx
	}
	res := &Result{}
	var mu sync.Mutex
	var outMu sync.Mutex
	finished := map[string]bool{}
	failed := map[string]bool{}
	running := map[string]bool{}
	services := map[string]*service{}
	sem := make(chan struct{}, o.Jobs)
	wake := make(chan struct{}, len(p.Targets)+1)
	var wg sync.WaitGroup
	stopping := false
	var firstErr error
	defer func() {
		for _, s := range services {
			s.stop()
		}
	}()
	inPlan := map[string]bool{}
	for _, t := range p.Targets {
		inPlan[t.Name] = true
	}
	remainingUsers := map[string]int{}
	for _, t := range p.Targets {
		for _, d := range t.Deps {
			if p.byName[d].Service {
				remainingUsers[d]++
			}
		}
	}
	for {
		mu.Lock()
		// only once this run builds something: a rerun with every target
		// done starts nothing
		working := len(res.Ran) > 0
		for _, r := range running {
			working = working || r
		}
		if working && !stopping {
			p.launchReadyServices(ctx, services, remainingUsers, finished, inPlan, o, &outMu)
		}
		progress := false
		pending := 0
		for _, t := range p.Targets {
			if finished[t.Name] || running[t.Name] || t.Service {
				continue
			}
			pending++
			ready, blocked := true, false
			for _, d := range t.Deps {
				// A service's prerequisites come before the service,
				// which comes before its user (as on Slurm, where the
				// service's job waits afterok on them).
				deps := []string{d}
				if dt := p.byName[d]; dt.Service {
					deps = dt.Deps
				}
				for _, d := range deps {
					if p.byName[d].Service {
						continue
					}
					if failed[d] {
						blocked = true
					}
					if !finished[d] && (inPlan[d] || !p.byName[d].Done) {
						ready = false
					}
				}
			}
			if blocked {
				finished[t.Name], failed[t.Name] = true, true
				res.Skipped = append(res.Skipped, t.Name)
				o.OnEvent(t, "skipped")
				progress = true
				continue
			}
			if !ready || stopping {
				continue
			}
			if err := p.Resolve(ctx, t); err != nil {
				mu.Unlock()
				return res, err
			}
			if t.Done {
				if err := p.settleLast(ctx, t); err != nil {
					mu.Unlock()
					return res, err
				}
				finished[t.Name] = true
				progress = true
				p.userDone(t, remainingUsers, services)
				continue
			}
			select {
			case sem <- struct{}{}:
			default:
				continue
			}
			running[t.Name] = true
			progress = true
			wg.Add(1)
			go func(t *Target) {
				defer wg.Done()
				start := time.Now()
				err := p.startServices(ctx, t, services, &mu, o, &outMu)
				if err != nil {
					var se *serviceError
					log := ""
					if errors.As(err, &se) {
						log = se.log
					}
					p.recordFailure(ctx, t, err.Error(), log, start)
				} else {
					o.OnEvent(t, "start")
					err = p.build(ctx, t, o, &outMu)
				}
				<-sem
				mu.Lock()
				running[t.Name] = false
				finished[t.Name] = true
				if err != nil {
					failed[t.Name] = true
					res.Failed = append(res.Failed, t.Name)
					if firstErr == nil {
						firstErr = err
					}
					if !o.KeepGoing {
						stopping = true
					}
					o.OnEvent(t, "failed")
				} else {
					res.Ran = append(res.Ran, t.Name)
					o.OnEvent(t, "done")
				}
				p.userDone(t, remainingUsers, services)
				mu.Unlock()
				wake <- struct{}{}
			}(t)
		}
		nrun := 0
		for _, r := range running {
			if r {
				nrun++
			}
		}
		mu.Unlock()
		if pending == 0 || (stopping && nrun == 0) {
			break
		}
		if ctx.Err() != nil && nrun == 0 {
			break
		}
		if !progress {
			select {
			case <-wake:
			case <-ctx.Done():
				// running builds see ctx and end; wait for them
				<-wake
			}
		}
	}
	wg.Wait()
	// A lost lock or an interrupt explains the targets it stopped: it is
	// the run's error (exit 1 for a lost lock, 130 for an interrupt).
	if cause := context.Cause(ctx); errors.Is(cause, ErrLockLost) {
		firstErr = cause
	} else if err := ctx.Err(); err != nil {
		firstErr = fmt.Errorf("kiln run interrupted (%w); done targets are recorded: run it again to resume", err)
	}
	p.settleServices()
	for i := len(p.Targets) - 1; i >= 0; i-- {
		if t := p.Targets[i]; !t.Service {
			res.Final = t.Identity()
			if !t.Done {
				res.Final = ""
			}
			break
		}
	}
	return res, firstErr
}

// launchReadyServices starts, without waiting for their health checks,
// the services whose prerequisites are done and which some target still
// needs: a service starts while other targets run (a vLLM engine takes
// minutes to load), and its first user waits only for what is left of its
// start-up (startServices). A service another process runs (external, or
// already healthy) is used, not started. A user not yet resolved counts as
// needing it, so a resumed run may start a service whose users all turn
// out done; it is stopped when the last is found done (userDone).
func (p *Plan) launchReadyServices(ctx context.Context, services map[string]*service, users map[string]int, finished, inPlan map[string]bool, o RunOptions, outMu *sync.Mutex) {
	for _, st := range p.Targets {
		if !st.Service || services[st.Name] != nil || users[st.Name] == 0 || external(st) {
			continue
		}
		ready := true
		for _, d := range st.Deps {
			if dt := p.byName[d]; !dt.Service && !finished[d] && (inPlan[d] || !dt.Done) {
				ready = false
			}
		}
		if !ready {
			continue
		}
		if st.Attrs.Health != "" && p.healthy(ctx, st) {
			s := &service{done: make(chan struct{}), awaited: true}
			close(s.done)
			services[st.Name] = s
			p.opts.Log.Info("service already healthy; using it", "service", st.Name)
			continue
		}
		p.opts.Log.Info("starting service", "service", st.Name)
		services[st.Name] = p.launchService(ctx, st, o, outMu)
	}
}

func (p *Plan) userDone(t *Target, remaining map[string]int, services map[string]*service) {
	for _, d := range t.Deps {
		if !p.byName[d].Service {
			continue
		}
		remaining[d]--
		if remaining[d] == 0 && services[d] != nil {
			services[d].stop()
		}
	}
}

type service struct {
	once sync.Once
	cmd  *exec.Cmd
	err  error
	done chan struct{}
	// st is the service's target; awaited is set once its health check
	// has passed (or it has none), from which its users may run.
	st       *Target
	launched time.Time
	awaited  bool
	// tmp is the service's KILN_TMPDIR, removed when it stops; keep
	// writes its output to the store (nil: nothing to keep).
	tmp  string
	keep func()
}

func (s *service) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.once.Do(func() {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.done
		}
		if s.keep != nil {
			s.keep()
		}
		if s.tmp != "" {
			os.RemoveAll(s.tmp)
		}
	})
}

// serviceError is a service that did not start or did not become
// healthy; log is the store key of its output.
type serviceError struct {
	err error
	log string
}

func (e *serviceError) Error() string { return e.err.Error() }
func (e *serviceError) Unwrap() error { return e.err }

// external reports whether another process runs service st for this run:
// its host variable (KILN_SERVICE_<NAME>_HOST) is already set, as the job
// script of a Slurm user sets it once the service's own job has published
// its host after its health check passed there (pipelines/slurm/doc.go).
func external(st *Target) bool {
	return os.Getenv(ServiceHostVar(st.Name)) != ""
}

// startServices starts (once) every service t uses, with its recipe's
// refs resolved (its prerequisites are done: Run waits for them), and
// waits until its health command passes.
func (p *Plan) startServices(ctx context.Context, t *Target, services map[string]*service, mu *sync.Mutex, o RunOptions, outMu *sync.Mutex) error {
	for _, d := range t.Deps {
		st := p.byName[d]
		if !st.Service {
			continue
		}
		mu.Lock()
		s := services[d]
		if s == nil && external(st) {
			// The service's Slurm companion job runs it and checked its
			// health where it runs; this run neither starts nor stops it.
			s = &service{done: make(chan struct{}), awaited: true}
			close(s.done)
			services[d] = s
			p.opts.Log.Info("service runs elsewhere; using it", "service", st.Name, "host", os.Getenv(ServiceHostVar(st.Name)), "target", t.Name)
		}
		if s == nil && st.Attrs.Health != "" && p.healthy(ctx, st) {
			// Already up: another process runs it; this run neither
			// starts nor stops it.
			s = &service{done: make(chan struct{}), awaited: true}
			close(s.done)
			services[d] = s
			p.opts.Log.Info("service already healthy; using it", "service", st.Name, "target", t.Name)
		}
		if s == nil {
			s = p.launchService(ctx, st, o, outMu)
			services[d] = s
		}
		if s.err == nil && !s.awaited {
			p.awaitService(ctx, s)
		}
		err := s.err
		mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// launchService starts service st without waiting for its health check
// (awaitService does). Its output is kept at logs/SERVICE/service.log.
func (p *Plan) launchService(ctx context.Context, st *Target, o RunOptions, outMu *sync.Mutex) *service {
	s := &service{done: make(chan struct{}), st: st, launched: time.Now()}
	logKey := p.serviceLog(st)
	fail := func(err error) *service {
		s.err = &serviceError{err: err, log: logKey}
		return s
	}
	if err := p.resolveService(st); err != nil {
		close(s.done)
		return fail(err)
	}
	tmp, err := os.MkdirTemp("", "kiln-service-")
	if err != nil {
		close(s.done)
		return fail(fmt.Errorf("service %s: creating its KILN_TMPDIR: %w", st.Name, err))
	}
	s.tmp = tmp
	var logBuf bytes.Buffer
	var logMu sync.Mutex
	s.keep = func() {
		logMu.Lock()
		defer logMu.Unlock()
		if _, err := p.opts.Store.Put(context.WithoutCancel(ctx), logKey, bytes.NewReader(logBuf.Bytes()), int64(logBuf.Len())); err != nil {
			p.opts.Log.Warn("keeping the service's output failed", "service", st.Name, "err", err)
		}
	}
	cmd := exec.Command("sh", "-c", strings.Join(st.Recipe, "\n"))
	cmd.Dir = filepath.Dir(p.Spec.Path)
	cmd.Env = append(p.env(st, -1), "KILN_TMPDIR="+tmp)
	pw := &prefixWriter{w: io.MultiWriter(o.Output, lockedWriter{&logBuf, &logMu}), mu: outMu, prefix: "[" + st.Name + "] "}
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		close(s.done)
		os.RemoveAll(tmp)
		return fail(fmt.Errorf("starting service %s: %w", st.Name, err))
	}
	s.cmd = cmd
	go func() { _ = cmd.Wait(); pw.flush(); close(s.done) }()
	return s
}

func (p *Plan) serviceLog(st *Target) string {
	return p.rec.prefix + "logs/" + st.Name + "/service.log"
}

// awaitService waits until launched service s passes its health check,
// 2 minutes at most from its launch, and records the outcome in s.
func (p *Plan) awaitService(ctx context.Context, s *service) {
	st, logKey := s.st, p.serviceLog(s.st)
	s.awaited = true
	if st.Attrs.Health == "" {
		return
	}
	deadline := s.launched.Add(2 * time.Minute)
	for {
		if p.healthy(ctx, st) {
			return
		}
		var err error
		select {
		case <-s.done:
			err = fmt.Errorf("service %s (%s:%d) exited before its health check passed; its output is in the store at %s", st.Name, st.Pos.File, st.Pos.Line, logKey)
		case <-time.After(100 * time.Millisecond):
			if time.Now().After(deadline) || ctx.Err() != nil {
				err = fmt.Errorf("service %s (%s:%d): health check %q did not pass within 2m; its output is in the store at %s", st.Name, st.Pos.File, st.Pos.Line, st.Attrs.Health, logKey)
			}
		}
		if err != nil {
			s.stop() // keeps its output
			s.err = &serviceError{err: err, log: logKey}
			return
		}
	}
}

// healthy reports whether service t's health command passes now. It runs
// with the environment of t's users, KILN_SERVICE_<NAME>_HOST included.
func (p *Plan) healthy(ctx context.Context, t *Target) bool {
	h := exec.CommandContext(ctx, "sh", "-c", t.Attrs.Health)
	h.Dir, h.Env = filepath.Dir(p.Spec.Path), p.env(t, -1)
	return h.Run() == nil
}

// env is the environment of t's recipe: KILN_STORE, KILN_TARGET,
// KILN_STEP, KILN_SHARDS (and KILN_SHARD for shard >= 0), and for each
// service of the plan that no other process runs (external),
// KILN_SERVICE_<NAME>_HOST=localhost: a local run starts its services on
// this host, and the variable is what a recipe or health check uses to
// reach one both locally and on Slurm.
func (p *Plan) env(t *Target, shard int) []string {
	env := append(os.Environ(), "KILN_STORE="+p.opts.Store.URI(), "KILN_TARGET="+t.Name,
		"KILN_STEP="+strconv.Itoa(t.Step), "KILN_SHARDS="+strconv.Itoa(max(t.Attrs.Shards, 1)))
	if shard >= 0 {
		env = append(env, "KILN_SHARD="+strconv.Itoa(shard))
	}
	for _, d := range append([]string{t.Name}, t.Deps...) {
		if dt := p.byName[d]; dt != nil && dt.Service && !external(dt) {
			env = append(env, ServiceHostVar(dt.Name)+"=localhost")
		}
	}
	return env
}

// build runs t's recipe (each shard, with retries), keeps its output in
// the store and records it done.
func (p *Plan) build(ctx context.Context, t *Target, o RunOptions, outMu *sync.Mutex) error {
	start := time.Now()
	var logBuf bytes.Buffer
	var outs []string
	var err error
	var only []int
	if t.Attrs.Shards > 1 {
		only = o.Shards
	}
	for attempt := 0; attempt <= t.Attrs.Retries; attempt++ {
		if attempt > 0 {
			p.opts.Log.Warn("retrying", "target", t.Name, "attempt", attempt+1, "err", err)
		}
		outs, err = p.runShards(ctx, t, o, outMu, &logBuf, only)
		if err == nil || ctx.Err() != nil {
			break
		}
	}
	logKey := p.rec.prefix + "logs/" + t.Name + "/" + t.Key + ".log"
	if only != nil {
		logKey = p.rec.prefix + "logs/" + t.Name + "/" + t.Key + ".shard-" + joinInts(only) + ".log"
	}
	if _, perr := p.opts.Store.Put(context.WithoutCancel(ctx), logKey, bytes.NewReader(logBuf.Bytes()), int64(logBuf.Len())); perr != nil {
		p.opts.Log.Warn("keeping the target's output failed", "target", t.Name, "err", perr)
	}
	ri := RunInfo{Start: start, Log: logKey, Outputs: outs}
	ref := ""
	if len(outs) > 0 {
		ref = outs[len(outs)-1]
	}
	if err == nil {
		ri.End = time.Now()
		if only != nil {
			err = p.shardsDone(ctx, t, only, ri)
		} else {
			err = p.MarkDoneRun(ctx, t, ref, ri)
		}
		if err == nil {
			return nil
		}
	}
	if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil {
		err = fmt.Errorf("%v (stopped: %v)", err, cause)
	}
	err = fmt.Errorf("target %s (%s:%d): %v; its output is in the store at %s (kiln why shows it)", t.Name, t.Pos.File, t.Pos.Line, err, logKey)
	p.recordFailure(ctx, t, err.Error(), logKey, start)
	return err
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// shardsDone records that the shards in only succeeded with ref, then marks
// t done if every shard of it has: the shards of one target run as separate
// processes (Slurm array tasks) with no driver, so the last to finish
// finds all the others' records and marks the target (its part was the
// last to land, so the version is committed). Two shards finishing at once
// may both mark it; the record is the same.
func (p *Plan) shardsDone(ctx context.Context, t *Target, only []int, ri RunInfo) error {
	st := p.opts.Store
	prefix := p.rec.prefix + "shards/" + t.Key + "/"
	// A shard's record is its outputs, one a line.
	ref := strings.Join(ri.Outputs, "\n")
	for _, i := range only {
		b := []byte(ref)
		if _, err := st.Put(ctx, prefix+strconv.Itoa(i), bytes.NewReader(b), int64(len(b))); err != nil {
			return fmt.Errorf("target %s: recording shard %d done in %s: %w", t.Name, i, st.URI(), err)
		}
	}
	refs := map[string]string{}
	err := st.List(ctx, prefix, func(info store.Info) error {
		b, _, err := store.ReadAll(ctx, st, info.Key)
		if err != nil {
			return err
		}
		refs[strings.TrimPrefix(info.Key, prefix)] = string(b)
		return nil
	})
	if err != nil {
		return fmt.Errorf("target %s: reading its shards' records: %w", t.Name, err)
	}
	for i := 0; i < t.Attrs.Shards; i++ {
		r, ok := refs[strconv.Itoa(i)]
		if !ok {
			p.opts.Log.Info("shard done; the target is done when every shard is", "target", t.Name, "shards", joinInts(only), "of", t.Attrs.Shards)
			return nil
		}
		if r != ref {
			return fmt.Errorf("target %s: shards printed different refs (%q, %q): the shards must write parts of one version", t.Name, strings.ReplaceAll(r, "\n", " "), strings.ReplaceAll(ref, "\n", " "))
		}
	}
	if t.Out != "" {
		for _, o := range ri.Outputs {
			if _, err := dataset.OpenString(ctx, st, o); err != nil {
				return fmt.Errorf("target %s: every shard is done but the store does not hold %s: %w", t.Name, o, err)
			}
		}
	}
	last := ""
	if len(ri.Outputs) > 0 {
		last = ri.Outputs[len(ri.Outputs)-1]
	}
	return p.MarkDoneRun(ctx, t, last, ri)
}

// Serve runs the service target name in the foreground until it exits or
// ctx ends (then SIGTERM to its process group, SIGKILL after 5 s): what a
// Slurm companion job runs (kiln run FILE --only SERVICE). A service is
// never recorded done; a stop by ctx is a clean end.
func (p *Plan) Serve(ctx context.Context, name string, output io.Writer) error {
	t := p.byName[name]
	if t == nil || !t.Service {
		return fmt.Errorf("%q is not a service target", name)
	}
	if output == nil {
		output = io.Discard
	}
	// Its recipe's refs, as a local run resolves them (Only checked
	// that its prerequisites are done).
	if err := p.resolveService(t); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "kiln-service-")
	if err != nil {
		return fmt.Errorf("service %s: creating its KILN_TMPDIR: %w", t.Name, err)
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("sh", "-c", strings.Join(t.Recipe, "\n"))
	cmd.Dir = filepath.Dir(p.Spec.Path)
	cmd.Env = append(p.env(t, -1), "KILN_TMPDIR="+tmp)
	pw := &prefixWriter{w: output, mu: new(sync.Mutex), prefix: "[" + t.Name + "] "}
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting service %s: %w", t.Name, err)
	}
	s := &service{cmd: cmd, done: make(chan struct{})}
	var werr error
	go func() { werr = cmd.Wait(); close(s.done) }()
	select {
	case <-s.done:
		pw.flush()
		if werr != nil {
			return fmt.Errorf("service %s (%s:%d) exited: %w", t.Name, t.Pos.File, t.Pos.Line, werr)
		}
		return nil
	case <-ctx.Done():
		s.stop()
		pw.flush()
		return nil
	}
}

// runShards runs t's recipe once per shard (only those in only, when not
// nil) and returns the refs they printed (outputs). With only, the
// versions may still wait for other shards' parts, so they are not
// required to be committed.
func (p *Plan) runShards(ctx context.Context, t *Target, o RunOptions, outMu *sync.Mutex, logBuf *bytes.Buffer, only []int) ([]string, error) {
	shards := only
	if shards == nil {
		for i := 0; i < max(t.Attrs.Shards, 1); i++ {
			shards = append(shards, i)
		}
	}
	n := len(shards)
	par := n
	if t.Attrs.Throttle > 0 {
		par = min(t.Attrs.Throttle, n)
	}
	stdouts := make([]string, n)
	errs := make([]error, n)
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	var logMu sync.Mutex
	for i := 0; i < n; i++ {
		shard := shards[i]
		if t.Attrs.Shards <= 1 {
			shard = -1
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(i, shard int) {
			defer wg.Done()
			defer func() { <-sem }()
			prefix := "[" + t.Name + "] "
			if shard >= 0 {
				prefix = fmt.Sprintf("[%s#%d] ", t.Name, shard)
			}
			tmp, err := os.MkdirTemp("", "kiln-target-")
			if err != nil {
				errs[i] = err
				return
			}
			defer os.RemoveAll(tmp)
			cmd := exec.CommandContext(ctx, "sh", "-e", "-c", strings.Join(t.Recipe, "\n"))
			cmd.Dir = filepath.Dir(p.Spec.Path)
			cmd.Env = append(p.env(t, shard), "KILN_TMPDIR="+tmp)
			for ph, d := range t.Refs {
				if v, err := refValue(p.byName[d], t.refSel[ph]); err == nil {
					cmd.Env = append(cmd.Env, ph+"="+v)
				}
			}
			cmd.SysProcAttr = childAttr()
			cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
			var stdout bytes.Buffer
			lw := &prefixWriter{w: io.MultiWriter(o.Output, lockedWriter{logBuf, &logMu}), mu: outMu, prefix: prefix}
			cmd.Stdout = io.MultiWriter(&stdout, lw)
			cmd.Stderr = lw
			errs[i] = exitError(cmd.Run())
			lw.flush()
			stdouts[i] = stdout.String()
		}(i, shard)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	outs, err := outputs(stdouts[n-1], t.Out)
	if err != nil {
		return nil, err
	}
	if t.Out == "" {
		return outs, nil
	}
	for _, s := range stdouts {
		so, _ := outputs(s, t.Out)
		if strings.Join(so, " ") != strings.Join(outs, " ") {
			return nil, fmt.Errorf("shards printed different refs (%q, %q): the shards must write parts of one version", strings.Join(so, " "), strings.Join(outs, " "))
		}
	}
	if only != nil {
		return outs, nil // shardsDone checks the commit once every shard is done
	}
	for _, o := range outs {
		r, _ := dataset.ParseRef(o)
		if _, err := dataset.Open(ctx, p.opts.Store, r); err != nil {
			return nil, fmt.Errorf("the recipe printed %s but the store does not hold it: %w", o, err)
		}
	}
	return outs, nil
}

// exitError is a recipe's error without its process state: an
// *exec.ExitError carries ExitCode(), which kiln's exit-status mapping
// would take as the run's own exit status, and kiln run exits 1 when a
// target fails, whatever the stage's status was (pipelines/README.md §5).
// The status stays in the message.
func exitError(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return errors.New(ee.Error())
	}
	return err
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// prefixWriter writes whole lines, each prefixed.
type prefixWriter struct {
	w      io.Writer
	mu     *sync.Mutex
	prefix string
	buf    []byte
	bmu    sync.Mutex
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.bmu.Lock()
	defer p.bmu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		p.emit(p.buf[:i+1])
		p.buf = p.buf[i+1:]
	}
	return len(b), nil
}

func (p *prefixWriter) emit(line []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := bufio.NewWriter(p.w)
	w.WriteString(p.prefix)
	w.Write(line)
	w.Flush()
}

func (p *prefixWriter) flush() {
	p.bmu.Lock()
	defer p.bmu.Unlock()
	if len(p.buf) > 0 {
		p.emit(append(p.buf, '\n'))
		p.buf = nil
	}
}

// childAttr is how a run starts a recipe's shell, a target's or a
// service's: in its own process group, so that stopping it (a lost lock,
// --keep-going's end, a service's shutdown) reaches everything the recipe
// started; and killed when the run dies. A run killed outright (SIGKILL,
// the OOM killer) cannot stop its children, and an orphan would go on
// after it: a service keeps its port (the rerun's health check then finds
// it and uses it) and fails on its first write to the dead run's pipe. The
// death signal reaches the recipe's shell, and the command it execs: a
// service's recipe ends in exec (pipelines/README.md §4); a stage whose
// shell is killed dies on its next write to the run's pipe.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
