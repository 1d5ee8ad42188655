package scheduler

const childEnv = "WARDEN_SCHED_CHILD"

func childMain() int { return 2 }
