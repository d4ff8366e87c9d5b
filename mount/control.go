package mount

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amlfs/amlfs/amlerr"
	"github.com/amlfs/amlfs/fuse"
	"github.com/amlfs/amlfs/mount/mountpoint"
	"github.com/amlfs/amlfs/tools"
)

// The control socket speaks HTTP+JSON over a unix socket at
// SocketPath(mountpoint):
//
//	GET  /v1/status[?lease=check]       -> Status (lease=check asks the store whether the lease is held)
//	POST /v1/commit   {"revision":ID, "fork":NEWID?, "include":[G], "exclude":[G], "gitignore":bool?, "retention":N?} -> SaveInfo
//	POST /v1/unmount  {"noSave":bool,"revision":ID} -> StopResult (after the daemon has stopped)
//	POST /v1/refresh  {"path":P}        -> {"refreshed":[prefixes]} (live mounts; "" for all)
//	GET  /v1/tools                      -> [{name, description, inputSchema}]
//	POST /v1/tools/NAME  {arguments}    -> the tool's result
//
// Every error answers one envelope, {"error":{"code":C,"message":M,
// "path":P,"exitCode":N}}, with the status the error table gives its code
// (amlerr): 400 for bad arguments or configuration, 403 for EACCES, EPERM
// and EROFS, 404 for ENOENT and an unknown tool, 409 for conflicts, 500
// for the rest.

type control struct {
	srv  *http.Server
	path string
}

func (c *control) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c.srv.Shutdown(ctx)
	os.Remove(c.path)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, err error) {
	writeJSON(w, amlerr.HTTPStatus(err), amlerr.Envelope{Error: amlerr.BodyOf(err)})
}

func decodeBody(r *http.Request, v any) error {
	data, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return amlerr.New(amlerr.InvalidConfig, "request", "malformed JSON: %v", err)
	}
	return nil
}

func (d *Daemon) serveControl() (*control, error) {
	if _, err := EnsureRuntimeDir(); err != nil {
		return nil, err
	}
	path := SocketPath(d.cfg.Mountpoint)
	// A socket left by a crashed daemon refuses connections; replace it.
	if conn, err := net.Dial("unix", path); err == nil {
		conn.Close()
		return nil, invalid(d.cfg.Mountpoint, "another amlfs daemon is serving this mountpoint (%s)", path)
	}
	os.Remove(path)
	// Bound under umask 077: the socket is 0600 from its first instant,
	// with no window in which another user could connect.
	old := unix.Umask(0o077)
	ln, err := net.Listen("unix", path)
	unix.Umask(old)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, d.status(r.URL.Query().Get("lease") == "check"))
	})
	mux.HandleFunc("POST /v1/commit", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Revision string `json:"revision"`
			Fork     string `json:"fork"`
			CommitOptions
		}
		if err := decodeBody(r, &req); err != nil {
			writeErr(w, err)
			return
		}
		// A client that gives up (killed, timed out) does not abort the
		// save: it completes, and a retry with the same revision id
		// finds it current.
		commit := func(ctx context.Context, rev string) (SaveInfo, error) {
			return d.CommitWith(ctx, rev, req.CommitOptions)
		}
		if req.Fork != "" {
			if req.CommitOptions.set() {
				writeErr(w, amlerr.New(amlerr.InvalidConfig, req.Fork, "a fork's first revision is saved with the mount's selection and retention"))
				return
			}
			commit = func(ctx context.Context, rev string) (SaveInfo, error) { return d.CommitFork(ctx, req.Fork, rev) }
		}
		info, err := commit(context.WithoutCancel(r.Context()), req.Revision)
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, info)
	})
	mux.HandleFunc("POST /v1/unmount", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			NoSave   bool   `json:"noSave"`
			Revision string `json:"revision"`
		}
		if err := decodeBody(r, &req); err != nil {
			writeErr(w, err)
			return
		}
		sr := stopRequest{noSave: req.NoSave, revision: req.Revision, reason: "unmount request", done: make(chan StopResult, 1)}
		select {
		case d.stopReqs <- sr:
		default:
			writeErr(w, amlerr.New(amlerr.DaemonStopped, "", "the daemon is already stopping"))
			return
		}
		writeJSON(w, http.StatusOK, <-sr.done)
	})
	mux.HandleFunc("POST /v1/refresh", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Path string `json:"path"`
		}
		if err := decodeBody(r, &req); err != nil {
			writeErr(w, err)
			return
		}
		done, err := d.Refresh(req.Path)
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string][]string{"refreshed": done})
	})
	// Tool calls are served beneath the mount's root, reached through
	// descriptors held since the mount and checked by mount id: no path
	// is resolved again, so a parent of the mountpoint renamed or
	// swapped for a symlink cannot turn them onto another tree.
	sandbox := d.cfg.SandboxPath
	if sandbox == "" {
		sandbox = d.cfg.Mountpoint
	}
	tfs := tools.NewOn(d.fs.Mount().Root, sandbox)
	if o := d.cfg.sandboxOwner; o != nil {
		tfs.SetOwner(o[0], o[1])
	}
	// Through FUSE, a call runs on the working tree itself where that
	// gives what the mount would (natively the mount is the tree, with no
	// daemon in the way).
	if d.fuseFS != nil {
		tfs.ServeDirect(treeDirect{d: d, fs: d.fuseFS})
	}
	d.tools = tfs
	mux.HandleFunc("GET /v1/tools", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, tools.Tools)
	})
	mux.HandleFunc("POST /v1/tools/{name}", func(w http.ResponseWriter, r *http.Request) {
		// Arguments beyond the bound (a write_file of base64 content over
		// MaxReadBytes, say) are TOO_LARGE, not a truncated JSON error.
		args, err := io.ReadAll(io.LimitReader(r.Body, tools.MaxArgsBytes+1))
		if err != nil {
			writeErr(w, err)
			return
		}
		if len(args) > tools.MaxArgsBytes {
			writeErr(w, &tools.Error{Code: tools.CodeTooLarge, Message: fmt.Sprintf("the call's arguments are over %d bytes: write large files in parts, or through the shell", tools.MaxArgsBytes)})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), d.cfg.ToolTimeout)
		defer cancel()
		// A mutation counts before (so that a save holding the writers
		// meanwhile reads every directory again) and after it.
		mutates := tools.Mutates(r.PathValue("name"))
		if mutates {
			d.fs.Touch()
		}
		out, err := tfs.Call(ctx, r.PathValue("name"), args)
		if mutates {
			d.fs.Touch()
		}
		if err != nil {
			writeErr(w, err)
			return
		}
		writeJSON(w, http.StatusOK, out)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	return &control{srv: srv, path: path}, nil
}

// Client talks to a daemon's control socket.
type Client struct {
	http *http.Client
	path string
	// mp is the mountpoint as given (absolute), and mountID the id of the
	// mount found there (0: none). Every request but a status goes only
	// to a daemon whose status names both (verify).
	mp      string
	mountID uint64
	// vmu guards verified: a client may be used by many goroutines.
	vmu      sync.Mutex
	verified bool
}

// ErrNotRunning means no daemon serves the mountpoint.
var ErrNotRunning = errors.New("no amlfs daemon serves this mountpoint")

// NewClient returns a client for the daemon serving mountpoint. The path
// is resolved with no symlink followed, and a daemon is talked to only if
// its status names the mount found there, by id, and the same
// mountpoint: a socket named by another path, a planted xattr or a
// parent swapped for a symlink cannot turn a command onto another mount.
func NewClient(mountPoint string) (*Client, error) {
	mp, err := filepath.Abs(mountPoint)
	if err != nil {
		return nil, err
	}
	c := &Client{mp: mp}
	top, err := openTop(mp)
	if err != nil {
		return nil, err
	}
	if top != nil {
		defer top.Close()
		c.mountID = mountpoint.RootID(top)
	}
	path := SocketPath(mp)
	if _, err := os.Lstat(path); err != nil && c.mountID != 0 {
		// Another runtime dir (a client started with an empty
		// environment): the mount itself names its daemon's socket.
		if p, ok := socketFromMount(top, c.mountID); ok {
			path = p
		}
	}
	c.path = path
	c.http = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			// A socket in a runtime dir others could write to may be
			// anyone's: never talk to it.
			if _, err := os.Lstat(RuntimeDir()); err == nil && !runtimeDirTrusted() {
				return nil, trustDir(RuntimeDir())
			}
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", path)
		},
	}}
	return c, nil
}

// openTop opens what is at mp now (the root of the topmost mount on it),
// following no symlink; nil if nothing is there.
func openTop(mp string) (*os.File, error) {
	if mp == "/" {
		return nil, nil
	}
	at, err := mountpoint.Open(mp, mountpoint.Policy{AllowUserOwnedParents: true})
	var me *mountpoint.Error
	switch {
	case errors.As(err, &me):
		return nil, invalid(me.Path, "%s", me.Msg)
	case errors.Is(err, os.ErrNotExist):
		return nil, nil
	case err != nil && isDead(err):
		return nil, nil
	case err != nil:
		return nil, err
	}
	defer at.Close()
	top, err := at.Top()
	if err != nil {
		return nil, nil
	}
	return top, nil
}

// verify checks, once, that the daemon behind the socket serves the mount
// found at the client's path.
func (c *Client) verify(ctx context.Context) error {
	c.vmu.Lock()
	defer c.vmu.Unlock()
	if c.verified {
		return nil
	}
	if c.mountID == 0 {
		return ErrNotRunning
	}
	var st Status
	if err := c.get(ctx, "/v1/status", &st); err != nil {
		return err
	}
	// The mount found at the path must be the daemon's, and the path its
	// mountpoint, or where the kernel says the mount is now (a parent of
	// it renamed).
	if st.MountID != c.mountID || filepath.Clean(st.Mountpoint) != c.mp && st.MountedAt != c.mp {
		return fmt.Errorf("%w: the daemon behind %s serves mount %d at %s, but %s is mount %d: refusing to talk to it", ErrWrongDaemon, c.path, st.MountID, st.Mountpoint, c.mp, c.mountID)
	}
	c.verified = true
	return nil
}

// ErrWrongDaemon is a control socket whose daemon does not serve the
// mount at the path given.
var ErrWrongDaemon = errors.New("not this mount's daemon")

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	if err := c.verify(ctx); err != nil {
		return err
	}
	return c.request(ctx, method, path, body, out)
}

func (c *Client) get(ctx context.Context, path string, out any) error {
	return c.request(ctx, http.MethodGet, path, nil, out)
}

func (c *Client) request(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		data, _ := json.Marshal(body)
		rd = bytes.NewReader(data)
	}
	status, data, err := c.roundTrip(ctx, method, path, rd)
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		var env amlerr.Envelope
		if json.Unmarshal(data, &env) != nil || env.Error.Code == "" {
			return fmt.Errorf("control socket: %d %s: %s", status, http.StatusText(status), data)
		}
		return env.Error.Err()
	}
	return json.Unmarshal(data, out)
}

// roundTrip sends one request and reads the whole answer.
func (c *Client) roundTrip(ctx context.Context, method, path string, body io.Reader) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://amlfs"+path, body)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return 0, nil, ErrNotRunning
		}
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

// Tool runs a tool call; a failed call returns a *tools.Error.
func (c *Client) Tool(ctx context.Context, name string, args json.RawMessage) (json.RawMessage, error) {
	if err := c.verify(ctx); err != nil {
		return nil, err
	}
	status, data, err := c.roundTrip(ctx, http.MethodPost, "/v1/tools/"+url.PathEscape(name), bytes.NewReader(args))
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		var env amlerr.Envelope
		if json.Unmarshal(data, &env) != nil || env.Error.Code == "" {
			return nil, fmt.Errorf("control socket: %d %s: %s", status, http.StatusText(status), data)
		}
		return nil, &tools.Error{Code: env.Error.Code, Message: env.Error.Message, Path: env.Error.Path}
	}
	return data, nil
}

// Status fetches the daemon's status. The lease is as the daemon's
// heartbeat last found it; StatusCheckingLease asks the store.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	err := c.do(ctx, http.MethodGet, "/v1/status", nil, &st)
	return st, err
}

// StatusCheckingLease is Status with the lease checked with the store
// now: one request to it.
func (c *Client) StatusCheckingLease(ctx context.Context) (Status, error) {
	var st Status
	err := c.do(ctx, http.MethodGet, "/v1/status?lease=check", nil, &st)
	return st, err
}

// Commit checkpoints a revision.
func (c *Client) Commit(ctx context.Context, revision string) (SaveInfo, error) {
	return c.CommitTo(ctx, revision, "")
}

// CommitTo checkpoints a revision; with fork set, as the first revision of
// that new workspace.
func (c *Client) CommitTo(ctx context.Context, revision, fork string) (SaveInfo, error) {
	return c.CommitWith(ctx, revision, fork, CommitOptions{})
}

// CommitWith checkpoints as CommitTo does, with opts for this commit.
func (c *Client) CommitWith(ctx context.Context, revision, fork string, opts CommitOptions) (SaveInfo, error) {
	var info SaveInfo
	body := struct {
		Revision string `json:"revision"`
		Fork     string `json:"fork,omitempty"`
		CommitOptions
	}{revision, fork, opts}
	err := c.do(ctx, http.MethodPost, "/v1/commit", body, &info)
	return info, err
}

// Unmount stops the daemon and waits for the outcome.
func (c *Client) Unmount(ctx context.Context, noSave bool, revision string) (StopResult, error) {
	var res StopResult
	err := c.do(ctx, http.MethodPost, "/v1/unmount", map[string]any{"noSave": noSave, "revision": revision}, &res)
	return res, err
}

// Refresh drops the kernel's caches of path in the live mounts.
func (c *Client) Refresh(ctx context.Context, path string) ([]string, error) {
	var out struct {
		Refreshed []string `json:"refreshed"`
	}
	err := c.do(ctx, http.MethodPost, "/v1/refresh", map[string]any{"path": path}, &out)
	return out.Refreshed, err
}

// socketFromMount asks the mount root, open as top, for its daemon's
// control socket, and takes the answer only if it is a socket this user
// owns. Natively it is the root-only NativeControlXattr; through FUSE the
// virtual fuse.ControlXattr, read only from a mount whose type is amlfs's
// own. The daemon behind it must still name this mount (verify).
func socketFromMount(top *os.File, id uint64) (string, bool) {
	buf := make([]byte, 4096)
	at := "/proc/self/fd/" + strconv.Itoa(int(top.Fd()))
	n, err := unix.Getxattr(at, NativeControlXattr, buf)
	if err != nil || n == 0 {
		if fstype, _ := mountpoint.Type(id); fstype != "fuse.amlfs" {
			return "", false
		}
		if n, err = unix.Getxattr(at, fuse.ControlXattr, buf); err != nil || n == 0 {
			return "", false
		}
	}
	p := string(buf[:n])
	var st unix.Stat_t
	if unix.Lstat(p, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK || int(st.Uid) != os.Geteuid() {
		return "", false
	}
	return p, true
}
