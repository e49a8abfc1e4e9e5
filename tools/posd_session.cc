// posd_session.cc — posd-session, the session process of posd.isolation: process. posd starts one
// per admitted client (docs/isolation.md); it is not run by hand. A thin main over session_process.
#include "remoting/server/session_process.h"

int main() { return pos::session_process_main(); }
