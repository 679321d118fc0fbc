// ComponentSet: one object per type, made on first use, the same one on every later call (from any
// thread), destroyed newest first by clear() and by the set's destructor.

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "core/ComponentSet.h"

namespace mt {
namespace {

std::vector<std::string>* gLog = nullptr;
std::atomic<int> gMade{0};

struct Plans {
  Plans() { ++gMade; }
  ~Plans() {
    if (gLog) gLog->push_back("plans");
  }
  int hits = 0;
};
struct Handles {
  ~Handles() {
    if (gLog) gLog->push_back("handles");
  }
  std::string name = "h";
};

TEST(ComponentSet, OnePerTypeMadeOnFirstUse) {
  gMade = 0;
  ComponentSet set;
  EXPECT_EQ(set.size(), 0u);
  Plans& a = set.get<Plans>();
  a.hits = 7;
  EXPECT_EQ(gMade.load(), 1);
  Plans& b = set.get<Plans>();
  EXPECT_EQ(&a, &b);
  EXPECT_EQ(b.hits, 7);
  EXPECT_EQ(set.get<Handles>().name, "h");
  EXPECT_EQ(set.size(), 2u);
  EXPECT_EQ(gMade.load(), 1);
}

TEST(ComponentSet, DestroyedNewestFirstByClearAndDestructor) {
  std::vector<std::string> log;
  gLog = &log;
  {
    ComponentSet set;
    set.get<Handles>();
    set.get<Plans>();
    set.clear();
    EXPECT_EQ(log, (std::vector<std::string>{"plans", "handles"}));
    EXPECT_EQ(set.size(), 0u);
    log.clear();
    set.get<Plans>();  // usable again after clear(): a new object
    set.get<Handles>();
  }
  EXPECT_EQ(log, (std::vector<std::string>{"handles", "plans"}));
  gLog = nullptr;
}

TEST(ComponentSet, ConcurrentFirstUseMakesOne) {
  gMade = 0;
  ComponentSet set;
  std::vector<Plans*> seen(8, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) threads.emplace_back([&, t] { seen[static_cast<size_t>(t)] = &set.get<Plans>(); });
  for (auto& th : threads) th.join();
  EXPECT_EQ(gMade.load(), 1);
  for (Plans* p : seen) EXPECT_EQ(p, seen[0]);
}

}  // namespace
}  // namespace mt
