package pgstore

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// listenRetry is how long the listener waits before reconnecting after
// its connection failed.
const listenRetry = time.Second

// Listen calls wake for every notification on the store's channel — a
// run submitted, a slot freed (a run left STARTING/RUNNING), a sweep that
// changed something — until ctx ends. It holds one connection of its own
// outside the pool. When the connection fails it calls wake (something may
// have happened meanwhile) and reconnects after listenRetry; the caller's
// fallback poll covers the gap.
func (s *Store) Listen(ctx context.Context, wake func()) {
	for ctx.Err() == nil {
		err := s.listenOnce(ctx, wake)
		if ctx.Err() != nil {
			return
		}
		_ = err // the caller's poll keeps admitting; the next attempt says more
		wake()
		t := time.NewTimer(listenRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (s *Store) listenOnce(ctx context.Context, wake func()) error {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	conn, err := pgx.ConnectConfig(cctx, s.pool.Config().ConnConfig.Copy())
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		conn.Close(c)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		return err
	}
	// Whatever happened before LISTEN took effect is not lost: one pass
	// now sees it.
	wake()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		wake()
	}
}
