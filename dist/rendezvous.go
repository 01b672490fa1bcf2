package dist

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// The rendezvous is a star: rank 0 listens on the job's address, every
// other rank connects to it, says who it is, and waits until all have come.
// The connections then carry the group's host-side traffic (NCCL's id, the
// barriers, gathered figures and, on the CPU, the collectives themselves),
// one length-prefixed frame at a time, and watch for a rank that dies.

// Frame kinds.
const (
	kindHello   byte = iota + 1 // rank → 0: its rank and the job's size
	kindWelcome                 // 0 → rank: every rank has joined
	kindData                    // a collective's payload
	kindBye                     // a clean exit
	kindFail                    // the job failed; the payload says why
)

type frame struct {
	kind byte
	data []byte
}

// peer is one connection of the star: on rank 0, to rank r; elsewhere, to rank 0.
type peer struct {
	rank int
	c    net.Conn
	in   chan frame // data frames, in order; closed when the connection ends
	wmu  sync.Mutex
	bye  atomic.Bool // the peer said goodbye: its end is not a failure
}

func (p *peer) send(kind byte, data []byte, timeout time.Duration) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	var hdr [5]byte
	hdr[0] = kind
	binary.LittleEndian.PutUint32(hdr[1:], uint32(len(data)))
	p.c.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := p.c.Write(hdr[:]); err != nil {
		return err
	}
	_, err := p.c.Write(data)
	return err
}

func readFrame(r io.Reader) (frame, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return frame{}, err
	}
	n := binary.LittleEndian.Uint32(hdr[1:])
	if n > 1<<31 {
		return frame{}, fmt.Errorf("a frame of %d bytes", n)
	}
	f := frame{kind: hdr[0], data: make([]byte, n)}
	_, err := io.ReadFull(r, f.data)
	return f, err
}

// rendezvous is a joined star.
type rendezvous struct {
	cfg     Config
	ln      net.Listener
	peers   map[int]*peer // rank 0: every other rank; elsewhere: rank 0
	fail    func(error)   // called once per failure seen by a reader
	closing atomic.Bool
	dead    chan struct{} // closed when the group failed
	told    chan struct{} // closed when the failure was sent to the other ranks
	deadMu  sync.Mutex
	err     error
}

// join meets the other ranks at cfg.Addr. fail hears of a rank that dies
// afterwards.
func join(cfg Config, fail func(error)) (*rendezvous, error) {
	r := &rendezvous{cfg: cfg, peers: map[int]*peer{}, fail: fail, dead: make(chan struct{}), told: make(chan struct{})}
	deadline := time.Now().Add(cfg.timeout())
	if cfg.Size == 1 {
		return r, nil
	}
	var err error
	if cfg.Rank == 0 {
		err = r.host(deadline)
	} else {
		err = r.dial(deadline)
	}
	if err != nil {
		r.close()
		return nil, err
	}
	for _, p := range r.peers {
		go r.read(p)
	}
	return r, nil
}

// host is rank 0's side: accept a hello from every other rank, then welcome them.
func (r *rendezvous) host(deadline time.Time) error {
	_, port, _ := net.SplitHostPort(r.cfg.Addr)
	ln, err := net.Listen("tcp", net.JoinHostPort("", port))
	if err != nil {
		return fmt.Errorf("rank 0 cannot listen for the rendezvous on port %s (MASTER_PORT): %v", port, err)
	}
	r.ln = ln
	if r.cfg.Store != "" {
		if err := r.publish(ln, deadline); err != nil {
			return err
		}
	}
	ln.(*net.TCPListener).SetDeadline(deadline)
	for len(r.peers) < r.cfg.Size-1 {
		c, err := ln.Accept()
		if err != nil {
			var missing []int
			for i := 1; i < r.cfg.Size; i++ {
				if r.peers[i] == nil {
					missing = append(missing, i)
				}
			}
			return fmt.Errorf("rendezvous on %s: ranks %v did not join within %v: %v", r.cfg.Addr, missing, r.cfg.timeout(), err)
		}
		c.SetReadDeadline(deadline)
		f, err := readFrame(c)
		if err != nil || f.kind != kindHello || len(f.data) != 8 {
			c.Close() // not one of ours, or gone: keep waiting for the ranks
			continue
		}
		rank, size := int(int32(binary.LittleEndian.Uint32(f.data))), int(int32(binary.LittleEndian.Uint32(f.data[4:])))
		p := &peer{rank: rank, c: c, in: make(chan frame, 16)}
		var why string
		switch {
		case size != r.cfg.Size:
			why = fmt.Sprintf("rank %d says the job has %d processes, rank 0 says %d (WORLD_SIZE)", rank, size, r.cfg.Size)
		case rank <= 0 || rank >= r.cfg.Size:
			why = fmt.Sprintf("rank %d joined a job of %d processes (RANK)", rank, r.cfg.Size)
		case r.peers[rank] != nil:
			why = fmt.Sprintf("two processes say they are rank %d (RANK)", rank)
		}
		if why != "" {
			p.send(kindFail, []byte(why), time.Second)
			c.Close()
			return errors.New("rendezvous: " + why)
		}
		c.SetReadDeadline(time.Time{})
		r.peers[rank] = p
	}
	for _, p := range r.peers {
		if err := p.send(kindWelcome, nil, r.cfg.timeout()); err != nil {
			return fmt.Errorf("rendezvous: welcoming rank %d: %v", p.rank, err)
		}
	}
	return nil
}

// publish writes rank 0's rendezvous address, the listener's port at the
// address this host reaches the store from, into the store under the
// config's key (Note [torchrun's store]).
func (r *rendezvous) publish(ln net.Listener, deadline time.Time) error {
	s, err := dialStore(r.cfg.Store, deadline)
	if err != nil {
		return fmt.Errorf("rank 0: %v", err)
	}
	defer s.close()
	host, _, _ := net.SplitHostPort(s.c.LocalAddr().String())
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	r.cfg.Addr = net.JoinHostPort(host, port)
	if err := s.set(r.cfg.StoreKey, []byte(r.cfg.Addr)); err != nil {
		return fmt.Errorf("rank 0: publishing its rendezvous address: %v", err)
	}
	return nil
}

// dial is every other rank's side: connect (rank 0 may start later; with a
// store, once it has published where), say hello, and wait for the welcome.
func (r *rendezvous) dial(deadline time.Time) error {
	where := "MASTER_ADDR:MASTER_PORT"
	if r.cfg.Store != "" {
		s, err := dialStore(r.cfg.Store, deadline)
		if err != nil {
			return fmt.Errorf("rank %d: %v", r.cfg.Rank, err)
		}
		addr, err := s.get(deadline, r.cfg.StoreKey)
		s.close()
		if err != nil {
			return fmt.Errorf("rank %d: rank 0 did not publish its rendezvous address (%s in the TCPStore at %s) within %v: %v",
				r.cfg.Rank, r.cfg.StoreKey, r.cfg.Store, r.cfg.timeout(), err)
		}
		r.cfg.Addr, where = string(addr), "published in the TCPStore"
	}
	var c net.Conn
	var err error
	for {
		c, err = net.DialTimeout("tcp", r.cfg.Addr, time.Second)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("rank %d: no rendezvous at %s (%s) within %v: %v", r.cfg.Rank, r.cfg.Addr, where, r.cfg.timeout(), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	p := &peer{rank: 0, c: c, in: make(chan frame, 16)}
	r.peers[0] = p
	hello := make([]byte, 8)
	binary.LittleEndian.PutUint32(hello, uint32(r.cfg.Rank))
	binary.LittleEndian.PutUint32(hello[4:], uint32(r.cfg.Size))
	if err := p.send(kindHello, hello, r.cfg.timeout()); err != nil {
		return fmt.Errorf("rank %d: rendezvous at %s: %v", r.cfg.Rank, r.cfg.Addr, err)
	}
	c.SetReadDeadline(deadline)
	f, err := readFrame(c)
	c.SetReadDeadline(time.Time{})
	switch {
	case err != nil:
		return fmt.Errorf("rank %d: rendezvous at %s: the other ranks did not all join within %v: %v", r.cfg.Rank, r.cfg.Addr, r.cfg.timeout(), err)
	case f.kind == kindFail:
		return errors.New("rendezvous: " + string(f.data))
	case f.kind != kindWelcome:
		return fmt.Errorf("rank %d: rendezvous at %s: unexpected frame %d", r.cfg.Rank, r.cfg.Addr, f.kind)
	}
	return nil
}

// read delivers p's data frames until the connection ends, and reports an
// end that was not a goodbye as the peer's death.
func (r *rendezvous) read(p *peer) {
	defer close(p.in)
	for {
		f, err := readFrame(p.c)
		if err != nil {
			if r.closing.Load() || p.bye.Load() {
				return
			}
			r.failed(fmt.Errorf("rank %d closed its connection to rank %d without finishing (it died or was stopped)",
				p.rank, r.cfg.Rank))
			return
		}
		switch f.kind {
		case kindData:
			p.in <- f
		case kindBye:
			p.bye.Store(true)
		case kindFail:
			r.failed(errors.New(string(f.data)))
			return
		}
	}
}

// failed records the group's first failure, tells the other ranks (rank 0
// passes it on to all), and calls fail.
func (r *rendezvous) failed(err error) {
	r.deadMu.Lock()
	if r.err != nil {
		r.deadMu.Unlock()
		return
	}
	r.err = err
	close(r.dead)
	r.deadMu.Unlock()
	var wg sync.WaitGroup
	for _, p := range r.peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.send(kindFail, []byte(err.Error()), time.Second)
		}()
	}
	wg.Wait()
	close(r.told)
	if r.fail != nil {
		r.fail(err)
	}
}

// Err is the group's failure, if any.
func (r *rendezvous) Err() error {
	r.deadMu.Lock()
	defer r.deadMu.Unlock()
	return r.err
}

// broken fails the group after a send to or a read from a peer failed with
// err. The peer's end most often comes with the reason (a kindFail frame,
// which another goroutine is reading), so it waits a moment for that first.
func (r *rendezvous) broken(err error) error {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-r.dead:
	case <-t.C:
		r.failed(err)
	}
	return r.Err()
}

// recv waits for p's next data frame.
func (r *rendezvous) recv(p *peer, what string) ([]byte, error) {
	t := time.NewTimer(r.cfg.timeout())
	defer t.Stop()
	select {
	case f, ok := <-p.in:
		if !ok {
			return nil, r.broken(fmt.Errorf("%s: rank %d is gone", what, p.rank))
		}
		return f.data, nil
	case <-r.dead:
		return nil, r.Err()
	case <-t.C:
		err := fmt.Errorf("%s: rank %d did not answer within %v", what, p.rank, r.cfg.timeout())
		r.failed(err)
		return nil, err
	}
}

// gather brings every rank's payload to rank 0 (in rank order); the other
// ranks get nil.
func (r *rendezvous) gather(what string, data []byte) ([][]byte, error) {
	if err := r.Err(); err != nil {
		return nil, err
	}
	if r.cfg.Rank != 0 {
		if err := r.peers[0].send(kindData, data, r.cfg.timeout()); err != nil {
			return nil, r.broken(fmt.Errorf("%s: sending to rank 0: %v", what, err))
		}
		return nil, nil
	}
	all := make([][]byte, r.cfg.Size)
	all[0] = data
	for rank := 1; rank < r.cfg.Size; rank++ {
		d, err := r.recv(r.peers[rank], what)
		if err != nil {
			return nil, err
		}
		all[rank] = d
	}
	return all, nil
}

// bcast sends rank 0's data to every rank and returns it.
func (r *rendezvous) bcast(what string, data []byte) ([]byte, error) {
	if err := r.Err(); err != nil {
		return nil, err
	}
	if r.cfg.Rank != 0 {
		return r.recv(r.peers[0], what)
	}
	for rank := 1; rank < r.cfg.Size; rank++ {
		if err := r.peers[rank].send(kindData, data, r.cfg.timeout()); err != nil {
			return nil, r.broken(fmt.Errorf("%s: sending to rank %d: %v", what, rank, err))
		}
	}
	return data, nil
}

// close says goodbye and closes the connections.
func (r *rendezvous) close() {
	if r.closing.Swap(true) {
		return
	}
	if r.Err() != nil {
		<-r.told // the other ranks hear why before the connections close
	}
	for _, p := range r.peers {
		if r.Err() == nil {
			p.send(kindBye, nil, time.Second)
		}
		p.c.Close()
	}
	if r.ln != nil {
		r.ln.Close()
	}
}
