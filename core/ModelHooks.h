#pragma once
// The moments a model offers the parallel layers (comm/DataParallel, sharding/ShardedEngine): around
// each unit's forward and backward, and when a parameter's gradient is final. The model calls them
// without knowing who listens.

#include "core/ParamTable.h"

namespace mt {

class ModelHooks {
 public:
  virtual ~ModelHooks() = default;
  virtual void beforeUnitForward(int unit) {}
  virtual void afterUnitForward(int unit) {}
  virtual void beforeUnitBackward(int unit) {}
  virtual void afterUnitBackward(int unit) {}
  // Whether Param::grad, zeroed before forward, is the buffer backward accumulates into (true for
  // data parallel); false where the hooks hand out gradient buffers during backward (sharding).
  // A model may add gradients during forward only where this holds.
  virtual bool gradsKeptAcrossForward() const { return true; }
  // Called once per parameter per backward, right after its gradient is final for this backward.
  virtual void gradReady(Param& p) {}
};

}  // namespace mt
