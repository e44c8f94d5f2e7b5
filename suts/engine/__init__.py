"""The engine under every SUT: what a request carries and how it samples, the one scheduler, the thread that serves a
SUT on it, and what one request's decoding measured."""
