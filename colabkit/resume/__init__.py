"""What every AutoResume shares, framework-free: when to save, the signal latch, the run record the panel reads."""
